"""Scaled dot-product attention (eq. 1) and multi-head attention (section 3.2.2).

Written with `keras.ops`, so the layers run on every Keras backend. Where
no one asks for the attention weights and none are dropped out (the
paper's attention_dropout_rate 0.0), `MultiHeadAttention` computes eq. 1
with `keras.ops.dot_product_attention`: under JAX and PyTorch that reaches
the backends' own kernels (cuDNN or flash attention on GPUs, where the
mask's form allows), under TensorFlow the same einsums and float32
softmax as ours, which XLA
compiles into one fused program within `xla_compiled()` (the trainer's
`--xla_attention`, docs/model.md).
Returned weights (the attention images, `Transformer.attention_weights`)
and dropout on them need the weights as a tensor: there
`ScaledDotProductAttention` computes them.
"""

import contextlib
import contextvars
import math

import keras

from tf_transformer.layers import compiled
from tf_transformer.layers import masks
from tf_transformer.layers import named_weights
from tf_transformer.layers.policy import PolicyLayer


def scaled_dot_product_attention(query, key, value, mask=None):
  """Eq. 1: softmax(Q K^T / sqrt(d_k)) V.

  Args:
    query: [batch, heads, query_length, d_k].
    key: [batch, heads, key_length, d_k].
    value: [batch, heads, key_length, d_v].
    mask: bool, broadcastable to [batch, heads, query_length, key_length];
      True = may attend.
  Returns:
    (output [batch, heads, query_length, d_v], weights [..., key_length]).
  """
  weights = attention_weights(query, key, mask)
  return keras.ops.matmul(weights, value), weights


def attention_weights(query, key, mask=None):
  """The weights of eq. 1: softmax(Q K^T / sqrt(d_k)), masked.

  Args:
    query: [batch, heads, query_length, d_k].
    key: [batch, heads, key_length, d_k].
    mask: as `scaled_dot_product_attention`'s.
  Returns:
    [batch, heads, query_length, key_length].
  """
  scale = keras.ops.cast(1.0 / math.sqrt(query.shape[-1]), query.dtype)
  scores = keras.ops.matmul(query * scale, keras.ops.swapaxes(key, -1, -2))
  return masks.masked_softmax(scores, mask)


def fused_attention(query, key, value, mask=None):
  """Eq. 1 by `keras.ops.dot_product_attention`, heads on axis 2.

  Args:
    query: [batch, query_length, heads, d_k].
    key: [batch, key_length, heads, d_k].
    value: [batch, key_length, heads, d_v].
    mask: as `scaled_dot_product_attention`'s (True = may attend).
  Returns:
    [batch, query_length, heads, d_v]: `scaled_dot_product_attention`'s
    output within float32 rounding (tests/test_attention_core.py).
  """
  return keras.ops.dot_product_attention(query, key, value, mask=mask)


_XLA_COMPILED = contextvars.ContextVar("xla_compiled", default=False)


@contextlib.contextmanager
def xla_compiled(enabled=True):
  """Within it, under TensorFlow, `MultiHeadAttention`'s fused core traced
  there runs as an XLA program of its own (`compiled.xla`), its mask
  broadcast to [batch, 1, query_length, key_length] so that encoder,
  decoder and cross-attention of one batch shape share one program (and
  one for its gradient). The training step traces its forward pass within
  it (`--xla_attention`); nothing is saved with the layers.

  Args:
    enabled: whether to compile; False leaves the core as it is.
  """
  token = _XLA_COMPILED.set(enabled)
  try:
    yield
  finally:
    _XLA_COMPILED.reset(token)


def _compiled_core(query, key, value, mask):
  """`fused_attention` with the mask broadcast to the scores' shape, run by
  XLA under TensorFlow (`xla_compiled`)."""
  if mask is None:
    return compiled.xla(fused_attention)(query, key, value)
  batch, query_length = keras.ops.shape(query)[:2]
  shape = (batch, 1, query_length, keras.ops.shape(key)[1])
  return compiled.xla(fused_attention)(query, key, value,
                                       keras.ops.broadcast_to(mask, shape))


@keras.saving.register_keras_serializable(package="tf_transformer")
class ScaledDotProductAttention(PolicyLayer):
  """Eq. 1 as a layer, with optional dropout on the attention weights.

  Args:
    dropout_rate: dropout on the weights; the paper has none (0.0).
  """

  def __init__(self, dropout_rate=0.0, **kwargs):
    super().__init__(**kwargs)
    self.dropout_rate = dropout_rate
    self.dropout = keras.layers.Dropout(dropout_rate,
                                        dtype=self.dtype_policy)

  def build(self, query_shape, key_shape=None, value_shape=None,
            attention_mask_shape=None):
    """No weights: the shapes are those of the call's arguments, as Keras 3
    names them."""
    self.dropout.build(query_shape)

  def call(self, query, key, value, attention_mask=None, training=None):
    """Args:
      query, key, value, attention_mask: as `scaled_dot_product_attention`.
      training: whether dropout applies.
    Returns:
      (output [batch, heads, query_length, d_v], weights [batch, heads,
      query_length, key_length]).
    """
    if training and self.dropout_rate > 0.0:
      weights = attention_weights(query, key, attention_mask)
      weights = self.dropout(weights, training=training)
      return keras.ops.matmul(weights, value), weights
    return scaled_dot_product_attention(query, key, value, attention_mask)

  def get_config(self):
    return {**super().get_config(), "dropout_rate": self.dropout_rate}


@keras.saving.register_keras_serializable(package="tf_transformer")
class MultiHeadAttention(PolicyLayer):
  """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O (section 3.2.2),
  head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

  The output has the query's last dimension, d_model. Masks are never named
  `mask`, so Keras' implicit mask propagation stays out of the way. A
  search's incremental step computes the same from `named_weights()`
  (`decoding/step.py`).

  Args:
    num_heads: h.
    d_k: the query and key width of a head (d_model / h in the paper; other
      sizes for Table 3 rows A and B).
    d_v: the value width of a head; None: d_k.
    attention_dropout_rate: dropout on the attention weights (0.0, the
      paper's).
  """

  def __init__(self, num_heads, d_k, d_v=None, attention_dropout_rate=0.0,
               **kwargs):
    super().__init__(**kwargs)
    self.num_heads = num_heads
    self.d_k = d_k
    self.d_v = d_v or d_k
    self.attention_dropout_rate = attention_dropout_rate
    dense = lambda units, name: keras.layers.Dense(units, name=name,
                                                   dtype=self.dtype_policy)
    self.query_dense = dense(num_heads * d_k, "query")
    self.key_dense = dense(num_heads * d_k, "key")
    self.value_dense = dense(num_heads * self.d_v, "value")
    self.output_dense = None  # W^O: needs d_model, known in build()
    self.attention = ScaledDotProductAttention(
        attention_dropout_rate, name="attention", dtype=self.dtype_policy)

  def build(self, query_shape, value_shape=None, attention_mask_shape=None,
            key_value_shape=None):
    """Weights from the shapes of the call's arguments, named as Keras 3
    names them; only `query_shape` and `value_shape` (self-attention when
    None) decide any."""
    d_model = query_shape[-1]
    value_shape = value_shape or query_shape
    self.query_dense.build(query_shape)
    self.key_dense.build(value_shape)
    self.value_dense.build(value_shape)
    self.output_dense = keras.layers.Dense(d_model, name="output",
                                           dtype=self.dtype_policy)
    self.output_dense.build((None, None, self.num_heads * self.d_v))

  def _heads(self, x, depth):
    """[batch, length, heads * depth] -> [batch, length, heads, depth]."""
    batch, length, _ = keras.ops.shape(x)
    return keras.ops.reshape(x, (batch, length, self.num_heads, depth))

  def _split_heads(self, x, depth):
    """[batch, length, heads * depth] -> [batch, heads, length, depth]."""
    return keras.ops.transpose(self._heads(x, depth), (0, 2, 1, 3))

  def _merge_heads(self, heads):
    """[batch, length, heads, d_v] -> [batch, length, heads * d_v]."""
    batch, length, _, _ = keras.ops.shape(heads)
    return keras.ops.reshape(heads, (batch, length, self.num_heads * self.d_v))

  def project_key_value(self, value):
    """(K W^K, V W^V) split into heads.

    Args:
      value: [batch, length, d_model], e.g. the encoder output.
    Returns:
      ([batch, heads, length, d_k], [batch, heads, length, d_v]).
    """
    return (self._split_heads(self.key_dense(value), self.d_k),
            self._split_heads(self.value_dense(value), self.d_v))

  def call(self, query, value=None, attention_mask=None, key_value=None,
           training=None, return_attention_scores=False):
    """Attends from `query` to `value` (self-attention when None).

    Args:
      query: [batch, query_length, d_model].
      value: [batch, key_length, d_model]; None: `query`.
      attention_mask: bool, True = may attend, broadcastable to [batch, heads,
        query_length, key_length].
      key_value: (key, value) heads from `project_key_value`, used instead of
        projecting `value`.
      training: whether dropout applies.
      return_attention_scores: also return the weights, as Keras'
        `MultiHeadAttention` does.
    Returns:
      [batch, query_length, d_model]; with `return_attention_scores`, (that,
      weights [batch, heads, query_length, key_length]).
    """
    swap = lambda x: keras.ops.transpose(x, (0, 2, 1, 3))  # heads <-> length
    query_heads = self._heads(self.query_dense(query), self.d_k)
    if key_value is None:
      source = query if value is None else value
      key_value = (self._heads(self.key_dense(source), self.d_k),
                   self._heads(self.value_dense(source), self.d_v))
    else:
      key_value = tuple(map(swap, key_value))
    if not (return_attention_scores or
            (training and self.attention_dropout_rate > 0.0)):
      core = _compiled_core if _XLA_COMPILED.get() else fused_attention
      heads = core(query_heads, *key_value, attention_mask)
      return self.output_dense(self._merge_heads(heads))
    heads, weights = self.attention(swap(query_heads), *map(swap, key_value),
                                    attention_mask, training=training)
    output = self.output_dense(self._merge_heads(swap(heads)))
    return (output, weights) if return_attention_scores else output

  def named_weights(self) -> named_weights.Attention:
    """W^Q, W^K, W^V and W^O with their biases."""
    affine = lambda dense: named_weights.Affine(dense.kernel, dense.bias)
    return named_weights.Attention(
        affine(self.query_dense), affine(self.key_dense),
        affine(self.value_dense), affine(self.output_dense), self.num_heads)

  def get_config(self):
    return {**super().get_config(), "num_heads": self.num_heads,
            "d_k": self.d_k, "d_v": self.d_v,
            "attention_dropout_rate": self.attention_dropout_rate}
