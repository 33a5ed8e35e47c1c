"""The two fused operations the decoding step (`decoding/step.py`) and the
search's encoder (`decoding/encoding.py`) are made of, on [rows, d_model]
activations: an affine map as one 2-D `MatMul` + `BiasAdd` (which
Grappler's remapper fuses into one kernel with a ReLU or a residual `AddN`),
and layer normalization in float32; and the residual block both wrap their
sub-layers in.
"""

import tensorflow as tf

_ACTIVATIONS = {"relu": tf.nn.relu, "swish": tf.nn.silu,
                "gelu": lambda x: tf.nn.gelu(x, approximate=False),
                "gelu_tanh": lambda x: tf.nn.gelu(x, approximate=True)}


def dense(x, kernel, bias, residual=None, activation=None):
  """x kernel + bias [+ residual], activated if asked.

  One `_FusedMatMul`: the bias as `BiasAdd`, whose only consumer may be a
  ReLU or the residual add, so that Grappler fuses them (swish and gelu
  run as kernels of their own).

  Args:
    x: [rows, d_in].
    kernel, bias: [d_in, d_out] and [d_out].
    residual: [rows, d_out] added after, or None.
    activation: None, or the feed-forward's (eq. 2's "relu", "swish",
      "gelu", "gelu_tanh"), as `layers.feed_forward.activate`.
  Returns:
    [rows, d_out].
  """
  y = tf.nn.bias_add(tf.matmul(x, kernel), bias)
  if activation is not None:
    y = _ACTIVATIONS[activation](y)
  return y if residual is None else tf.math.add_n([y, residual])


def layer_norm(x, gamma, epsilon):
  """LayerNorm over the last axis in at least float32, without its beta
  (the affine maps after it add beta, `step_weights.py`):
  gamma * (x - mean) / sqrt(variance + epsilon).

  Args:
    x: [..., d_model].
    gamma: [d_model], or None where the matmuls after it carry it.
    epsilon: the layer's epsilon.
  Returns:
    x's shape and dtype.
  """
  dtype = x.dtype
  x = tf.cast(x, tf.float32) if dtype != tf.float32 else x
  centered = x - tf.reduce_mean(x, -1, keepdims=True)
  variance = tf.reduce_mean(tf.square(centered), -1, keepdims=True)
  y = centered * tf.math.rsqrt(variance + epsilon)
  if gamma is not None:
    y *= tf.cast(gamma, tf.float32)
  return tf.cast(y, dtype) if dtype != tf.float32 else y


def residual(x, norm_position, norm, sublayer):
  """Section 3.1's residual connection around a sub-layer,
  LayerNorm(x + Sublayer(x)) ("post"), or its pre-norm variant
  x + Sublayer(LayerNorm(x)) ("pre").

  Args:
    x: [rows, d_model].
    norm_position: "post" or "pre".
    norm: x -> the block's layer normalization of x.
    sublayer: (input, residual) -> Sublayer(input) + residual, the add
      inside it so that it fuses with the last matmul (`dense`).
  Returns:
    [rows, d_model].
  """
  if norm_position == "pre":
    return sublayer(norm(x), x)
  return norm(sublayer(x, x))
