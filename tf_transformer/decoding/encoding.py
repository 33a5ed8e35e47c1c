"""The encoder stack (section 3.1, Figure 1 left) for a search, on the real
tokens of a batch only: what `Transformer.encode` computes, as few kernels.

    named = model.named_weights()
    weights = prepare(named, model.compute_dtype)
    memory, source_mask = encode(weights, step.shape, source_ids, named)

A request's sources are padded to its longest (in a batch of 32 captions
about 45% of the positions are padding), and the Keras layers compute every
projection and feed-forward layer on those positions too. Here the
position-wise parts (the Q/K/V and output projections, eq. 2, the residuals
and normalizations) run on the [tokens, d_model] rows of the real tokens,
each a 2-D `MatMul` + `BiasAdd` that Grappler fuses (`fused_ops.dense`), and
only the attention itself (eq. 1) sees the padded [batch, length] layout,
scattered there and gathered back. The memory is zero at padded positions,
which no attention reads (`masks.key_padding_mask`). The layers' weights
are prepared once per export or search, as the decoding step's: Q, K and V
one kernel with 1 / sqrt(d_k) folded into W^Q; the feed-forward with the
training layer's zero inner units. The embeddings (and a learned position
table) are the model's own variables, read by row: an export stores no
second copy of the vocabulary's table. tests/test_encoding.py holds this equal
to `Transformer.encode` at every real position.
"""

import math
import typing

import tensorflow as tf

from tf_transformer.decoding.fused_ops import dense
from tf_transformer.decoding.fused_ops import layer_norm
from tf_transformer.decoding.fused_ops import residual
from tf_transformer.layers import masks
from tf_transformer.layers import named_weights as named
from tf_transformer.layers.embedding import sinusoid_table
from tf_transformer.layers.feed_forward import inner_padding
from tf_transformer.layers.feed_forward import padded_weights


class EncoderLayer(typing.NamedTuple):
  """One encoder layer's weights as `encode` multiplies by them."""
  qkv_kernel: tf.Tensor  # [d_model, heads * (2 d_k + d_v)], W^Q scaled
  qkv_bias: tf.Tensor
  output_kernel: tf.Tensor  # W^O
  output_bias: tf.Tensor
  attention_gamma: tf.Tensor  # the self-attention block's LayerNorm
  attention_beta: tf.Tensor
  inner_kernel: tf.Tensor  # W_1, b_1 of eq. 2, with zero inner units
  inner_bias: tf.Tensor
  outer_kernel: tf.Tensor  # W_2, b_2
  outer_bias: tf.Tensor
  feed_forward_gamma: tf.Tensor
  feed_forward_beta: tf.Tensor


class EncoderWeights(typing.NamedTuple):
  """The encoder's layers as `encode` multiplies by them."""
  layers: tuple
  final_gamma: typing.Optional[tf.Tensor]  # pre-norm's last LayerNorm
  final_beta: typing.Optional[tf.Tensor]


def _layer(layer: named.Layer, dtype) -> EncoderLayer:
  attention = layer.self_attention
  d_k = attention.query.kernel.shape[-1] // attention.num_heads
  scale = 1.0 / math.sqrt(d_k)
  f32 = lambda x: tf.cast(x, tf.float32)
  cast = lambda x: tf.cast(x, dtype)
  qkv_kernel = tf.concat([f32(attention.query.kernel) * scale,
                          f32(attention.key.kernel),
                          f32(attention.value.kernel)], axis=-1)
  qkv_bias = tf.concat([f32(attention.query.bias) * scale,
                        f32(attention.key.bias), f32(attention.value.bias)],
                       axis=-1)
  inner, outer = layer.feed_forward.inner, layer.feed_forward.outer
  inner_kernel, inner_bias, outer_kernel = padded_weights(
      cast(inner.kernel), cast(inner.bias), cast(outer.kernel),
      inner_padding(inner.kernel.shape[-1], dtype))
  norms = (layer.self_attention_norm, layer.feed_forward_norm)
  return EncoderLayer(
      cast(qkv_kernel), cast(qkv_bias), cast(attention.output.kernel),
      cast(attention.output.bias), cast(norms[0].gamma), cast(norms[0].beta),
      inner_kernel, inner_bias, outer_kernel, cast(outer.bias),
      cast(norms[1].gamma), cast(norms[1].beta))


def prepare(model: named.Model, dtype) -> EncoderWeights:
  """The weights `encode` multiplies by, from the layers' own.

  Args:
    model: a `named_weights.Model` (`Transformer.named_weights()`).
    dtype: the compute dtype.
  Returns:
    `EncoderWeights`.
  """
  final = model.encoder.final_norm
  return EncoderWeights(
      tuple(_layer(layer, dtype) for layer in model.encoder.layers),
      None if final is None else tf.cast(final.gamma, dtype),
      None if final is None else tf.cast(final.beta, dtype))


def _norm(x, gamma, beta, epsilon):
  """LayerNorm(x) with its gain and bias (in float32, `fused_ops.layer_norm`)."""
  return layer_norm(x, gamma, epsilon) + beta


def _block(x, gamma, beta, shape, fn):
  """`fused_ops.residual` around `fn`, its norm with gain and bias."""
  return residual(x, shape.norm_position,
                  lambda y: _norm(y, gamma, beta, shape.epsilon), fn)


def _self_attention(x, weights, shape, where, padded_shape, key_mask):
  """Multi-head self-attention (eq. 1, section 3.2.2) of the real tokens'
  rows `x` [tokens, d_model] over each sentence's real tokens: [tokens,
  heads * d_v], before W^O."""
  h, d_k, d_v = shape.num_heads, shape.d_k, shape.d_v
  qkv = dense(x, weights.qkv_kernel, weights.qkv_bias)
  width = h * (2 * d_k + d_v)
  qkv = tf.scatter_nd(where, qkv, tf.concat([padded_shape, [width]], 0))
  if d_k == d_v:  # [batch, length, 3, h, d] -> 3 x [batch, h, length, d]
    q, k, v = tf.unstack(tf.transpose(
        tf.reshape(qkv, tf.concat([padded_shape, [3, h, d_k]], 0)),
        [2, 0, 3, 1, 4]))
  else:
    heads = lambda y, depth: tf.transpose(tf.reshape(
        y, tf.concat([padded_shape, [h, depth]], 0)), [0, 2, 1, 3])
    q, k, v = tf.split(qkv, [h * d_k, h * d_k, h * d_v], axis=-1)
    q, k, v = heads(q, d_k), heads(k, d_k), heads(v, d_v)
  scores = tf.matmul(q, k, transpose_b=True)
  heads = tf.matmul(masks.masked_softmax(scores, key_mask), v)
  merged = tf.transpose(heads, [0, 2, 1, 3])  # [batch, length, h, d_v]
  return tf.reshape(tf.gather_nd(merged, where), [-1, h * d_v])


def _encoder_layer(x, weights, shape, where, padded_shape, key_mask):
  """One encoder layer (section 3.1: self-attention, then the
  feed-forward network, each in its residual block) on the real tokens'
  rows `x` [tokens, d_model]."""

  def self_attention(y, residual):
    return dense(_self_attention(y, weights, shape, where, padded_shape,
                                 key_mask),
                 weights.output_kernel, weights.output_bias, residual)

  def feed_forward(y, residual):
    inner = dense(y, weights.inner_kernel, weights.inner_bias,
                  activation=shape.activation)
    return dense(inner, weights.outer_kernel, weights.outer_bias, residual)

  x = _block(x, weights.attention_gamma, weights.attention_beta, shape,
             self_attention)
  return _block(x, weights.feed_forward_gamma, weights.feed_forward_beta,
                shape, feed_forward)


def encode(weights: EncoderWeights, shape, source_ids, model: named.Model):
  """The encoder stack on `source_ids`' real tokens (the module docstring).

  Args:
    weights: `EncoderWeights` (`prepare`).
    shape: the model's `step.Shape` (heads, d_k, d_v, norm position,
      epsilon, activation, positional encoding; the encoder's are the
      decoder's).
    source_ids: [batch, length] int32, PAD-padded.
    model: the model's `named_weights.Model`, for its source embeddings
      (scaled as 3.4 says) and positions (3.5).
  Returns:
    (memory [batch, length, d_model], zero at padding; the source padding
    mask [batch, length] bool), as `Transformer.encode`.
  """
  source_mask = masks.padding_mask(source_ids)
  where = tf.cast(tf.where(source_mask), tf.int32)  # [tokens, 2]
  padded_shape = tf.shape(source_ids)
  dtype = weights.layers[0].qkv_kernel.dtype
  d_model = model.source_embedding.shape[-1]
  x = tf.cast(tf.gather(model.source_embedding,
                        tf.gather_nd(source_ids, where)), dtype)
  if model.embedding_scale != 1.0:
    x *= tf.cast(model.embedding_scale, dtype)
  if model.source_positions is not None:
    positions = tf.cast(model.source_positions, dtype)
  else:
    positions = sinusoid_table(tf.range(padded_shape[1]), d_model, dtype,
                               kind=shape.positional_encoding)
  x += tf.gather(positions, where[:, 1])
  key_mask = masks.key_padding_mask(source_mask)
  for layer in weights.layers:
    x = _encoder_layer(x, layer, shape, where, padded_shape, key_mask)
  if weights.final_gamma is not None:
    x = _norm(x, weights.final_gamma, weights.final_beta, shape.epsilon)
  memory = tf.scatter_nd(where, x, tf.concat([padded_shape, [d_model]], 0))
  return memory, source_mask
