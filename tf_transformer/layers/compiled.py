"""XLA for one function under the TensorFlow backend (Keras 3 multi-backend).

The label-smoothed loss (section 5.4) and, with `--xla_attention`, the
attention core (eq. 1) take only tensors, so under TensorFlow each runs as
its own `tf.function(jit_compile=True)`: XLA fuses it on any device and
inside every replica of a distribution strategy, while the rest of the step
runs uncompiled. JAX and PyTorch compile whole
training steps (`jax.jit`, Keras' `jit_compile`), so there the function runs
as written. TensorFlow is imported only under its own backend.
"""

import functools

import keras


def xla(fn):
  """`fn` compiled by XLA on its own under TensorFlow; `fn` elsewhere.

  Args:
    fn: a function of tensors alone.
  Returns:
    The function to call, made once per `fn`.
  """
  if keras.backend.backend() != "tensorflow":
    return fn  # no cache in the way of torch.compile's trace
  return _tf_xla(fn)


@functools.cache
def _tf_xla(fn):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.function(fn, jit_compile=True, autograph=False)
