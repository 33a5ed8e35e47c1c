"""The dtype policy of every public layer (Keras 3 mixed precision).

A layer given `dtype="mixed_bfloat16"` (or "mixed_float16", "bfloat16", or
none: the global policy) computes in the policy's compute dtype and keeps its
weights in the variable dtype; every layer it creates gets the same policy
(`dtype=self.dtype_policy`), so one policy reaches every matmul. Where half
precision is not safe the arithmetic runs in float32 inside the layer: the
attention softmax (`masks.masked_softmax`), layer normalization (Keras'
`LayerNormalization` does) and the logits at the loss and the search
(`Transformer.decode`).

`PolicyLayer` also loads a config that an earlier release wrote with keys
the layers no longer take (`layers/retired.py`).

It adds what `keras.layers.Layer` leaves out: its
`compute_output_spec`, called directly rather than through `__call__`,
traces `call` with the inputs as given, so a float32 spec came back from a
bfloat16 layer. It casts floating inputs as `__call__` does first, and
under PyTorch gives the spec the compute dtype that Keras' meta-device trace
loses (see `compute_output_spec`).
"""

import keras

from tf_transformer.layers import retired


class PolicyLayer(keras.layers.Layer):
  """A Keras layer whose output spec is in its compute dtype."""

  def compute_output_spec(self, *args, **kwargs):
    convert = lambda x: self.dtype_policy.convert_input(x, self.autocast,
                                                        self.input_dtype)
    spec = super().compute_output_spec(
        *keras.tree.map_structure(convert, args),
        **keras.tree.map_structure(convert, kwargs))
    if keras.backend.backend() != "torch" or not self._mixed():
      return spec
    # Keras' torch backend traces on the "meta" device, where a variable's
    # stand-in keeps the variable dtype, not the autocast one
    # (`Variable.value` in keras/src/backend/torch/core.py): a product with
    # a weight comes out float32 in the trace alone. Eager calls are right.
    def in_compute_dtype(tensor):
      if keras.backend.standardize_dtype(tensor.dtype) != (
          self.dtype_policy.variable_dtype):
        return tensor
      return keras.KerasTensor(tensor.shape, self.compute_dtype,
                               sparse=tensor.sparse, ragged=tensor.ragged)
    return keras.tree.map_structure(in_compute_dtype, spec)

  @classmethod
  def from_config(cls, config):
    return super().from_config(retired.without_retired(config))

  def _mixed(self):
    return self.autocast and (self.dtype_policy.compute_dtype !=
                              self.dtype_policy.variable_dtype)
