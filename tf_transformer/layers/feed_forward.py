"""Position-wise feed-forward network (section 3.3, eq. 2), in `keras.ops`."""

import keras
import ml_dtypes

from tf_transformer.layers import named_weights
from tf_transformer.layers.policy import PolicyLayer

# A matmul whose rows (of the weight, or of the activations it writes) lie a
# multiple of 512 bytes apart can run slower, its rows falling into the same
# cache sets (docs/performance.md, "Widths a multiple of 512 bytes"). d_ff is
# a power of two in every preset.
_ALIASING_STRIDE_BYTES = 512
_CACHE_LINE_BYTES = 64


def inner_padding(d_ff, dtype):
  """Zero units to add to the inner layer so that its rows are not a
  multiple of 512 bytes apart. The padded units compute act(x 0 + 0) = 0
  (relu, swish and both gelus of 0 are 0) and W_2's padded rows are 0, so FFN(x)
  is the same.

  Args:
    d_ff: the inner width.
    dtype: the compute dtype.
  Returns:
    One cache line's worth of units (16 in float32), or 0 where d_ff's rows
    are not such a multiple.
  """
  itemsize = ml_dtypes.finfo(keras.backend.standardize_dtype(dtype)).bits // 8
  if (d_ff * itemsize) % _ALIASING_STRIDE_BYTES:
    return 0
  return _CACHE_LINE_BYTES // itemsize


def padded_weights(w1, b1, w2, padding):
  """(W_1, b_1, W_2) of eq. 2 with `padding` zero inner units appended."""
  if not padding:
    return w1, b1, w2
  pad = keras.ops.pad
  return (pad(w1, [[0, 0], [0, padding]]), pad(b1, [[0, padding]]),
          pad(w2, [[0, padding], [0, 0]]))


def activate(x, activation):
  """The inner layer's activation: "relu", eq. 2's max(0, x); "swish",
  x sigmoid(x) (SiLU); "gelu", x Phi(x), exact (erf), as Transformers';
  "gelu_tanh", its tanh approximation, as OpenNMT-tf's `gelu`.

  Args:
    x: a tensor.
    activation: one of config.ACTIVATIONS.
  Returns:
    x's shape and dtype.
  """
  if activation == "relu":
    return keras.ops.relu(x)
  if activation == "swish":
    return keras.ops.silu(x)
  if activation == "gelu":
    return keras.ops.gelu(x, approximate=False)
  if activation == "gelu_tanh":
    return gelu_tanh(x)
  raise ValueError(f"activation={activation!r}: expected 'relu', 'swish', "
                   "'gelu' or 'gelu_tanh'")


@keras.saving.register_keras_serializable(package="tf_transformer")
def gelu_tanh(x):
  """GELU's tanh approximation, as a Keras activation (`Dense`'s, which
  has no name for it)."""
  return keras.ops.gelu(x, approximate=True)


@keras.saving.register_keras_serializable(package="tf_transformer")
class PositionwiseFeedForward(PolicyLayer):
  """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2 (eq. 2), applied to each
  position alike; with another `activation`, act(x W_1 + b_1) W_2 + b_2.

  The weights are two `Dense` layers, `inner` and `outer`; the product runs
  on W_1 and W_2 padded with `inner_padding` zero units (the same function,
  off the cache-aliasing widths above).

  Args:
    d_ff: the inner layer's width; the output has the input's d_model.
    activation: "relu" (eq. 2), "swish", "gelu" or "gelu_tanh"
      (`activate`).
  """

  def __init__(self, d_ff, activation="relu", **kwargs):
    super().__init__(**kwargs)
    self.d_ff = d_ff
    self.activation = activation
    self.inner = keras.layers.Dense(
        d_ff, activation=gelu_tanh if activation == "gelu_tanh" else activation,
        name="inner", dtype=self.dtype_policy)
    self.outer = None

  def build(self, x_shape):
    self.inner.build(x_shape)
    self.outer = keras.layers.Dense(x_shape[-1], name="outer",
                                    dtype=self.dtype_policy)
    self.outer.build(tuple(x_shape[:-1]) + (self.d_ff,))

  def call(self, x):
    """Args:
      x: [..., d_model].
    Returns:
      FFN(x), [..., d_model].
    """
    dtype = self.compute_dtype
    cast = lambda w: keras.ops.cast(w, dtype)
    w1, b1, w2 = padded_weights(
        cast(self.inner.kernel), cast(self.inner.bias),
        cast(self.outer.kernel), inner_padding(self.d_ff, dtype))
    # keras.ops.matmul as `Dense` calls it: under TensorFlow a rank-3 x
    # becomes one 2-D MatMul (tf.matmul would broadcast a BatchMatMulV2).
    inner = activate(keras.ops.matmul(x, w1) + b1, self.activation)
    return keras.ops.matmul(inner, w2) + cast(self.outer.bias)

  def named_weights(self) -> named_weights.FeedForward:
    """W_1, b_1 and W_2, b_2 of eq. 2 (without the padding)."""
    return named_weights.FeedForward(
        named_weights.Affine(self.inner.kernel, self.inner.bias),
        named_weights.Affine(self.outer.kernel, self.outer.bias))

  def get_config(self):
    return {**super().get_config(), "d_ff": self.d_ff,
            "activation": self.activation}
