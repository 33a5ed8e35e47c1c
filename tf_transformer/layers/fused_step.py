"""One decoding step of the decoder stack (section 3.1, Figure 1 right) as
few kernels: the serving path of the same function the Keras layers compute.

A search runs the decoder once per output token on a handful of rows, where
each TensorFlow kernel does a few microseconds' work and the executor's cost
per kernel counts as much. This step computes what `Decoder` with a cache
computes, from the same weights, with fewer kernels:

- every projection is a 2-D `MatMul` followed by `BiasAdd`, which Grappler's
  remapper fuses into one `_FusedMatMul` (with the feed-forward ReLU, and
  under oneDNN the residual `Add`); Keras' `Dense` on [batch, group,
  d_model] is a `BatchMatMulV2` plus an `Add`, which never fuse;
- Q, K and V of the self-attention are one matmul against their
  concatenated kernels, with 1 / sqrt(d_k) (eq. 1) folded into W^Q (exact
  when d_k is a power of 4, as 64 is);
- the weights are tensors read once per request (`prepare`, or an export's
  stored copy), not variables read at every step, and the positional
  encodings a table read by row;
- activations stay [rows, d_model] from layer to layer, with no reshape
  between the sub-layers.

Layer normalization is written as Keras 3 writes it (`keras.ops.
layer_normalization`: float32 moments, x * inv + (beta - mean * inv)), so
the step equals the Keras layers' step to rounding. The Keras layers stay
the path for training, teacher forcing and attention weights;
tests/test_fused_step.py checks that both give the same logits.
"""

import math
import typing

import tensorflow as tf

from tf_transformer.layers import decoding_cache
from tf_transformer.layers import masks
from tf_transformer.layers.embedding import sinusoid_table


class Norm(typing.NamedTuple):
  gamma: tf.Tensor
  beta: tf.Tensor


class LayerWeights(typing.NamedTuple):
  """One decoder layer's weights as the step multiplies by them."""
  qkv_kernel: tf.Tensor  # [d_model, heads * (2 d_k + d_v)], W^Q scaled
  qkv_bias: tf.Tensor
  self_output_kernel: tf.Tensor  # W^O of the self-attention
  self_output_bias: tf.Tensor
  self_norm: Norm
  cross_query_kernel: tf.Tensor  # W^Q of the encoder-decoder attention, scaled
  cross_query_bias: tf.Tensor
  cross_output_kernel: tf.Tensor
  cross_output_bias: tf.Tensor
  cross_norm: Norm
  inner_kernel: tf.Tensor  # W_1, b_1 of eq. 2
  inner_bias: tf.Tensor
  outer_kernel: tf.Tensor  # W_2, b_2
  outer_bias: tf.Tensor
  feed_forward_norm: Norm


class StepWeights(typing.NamedTuple):
  """Everything a decoding step multiplies by, prepared once
  (`prepare`)."""
  embeddings: tf.Tensor  # target embeddings times sqrt(d_model) (3.4)
  positions: tf.Tensor  # [max_positions, d_model] (3.5)
  layers: tuple
  final_norm: typing.Optional[Norm]  # pre-norm stacks only
  output_kernel: tf.Tensor  # [d_model, vocab]: the pre-softmax transform


def _norm(layer_norm):
  return Norm(tf.convert_to_tensor(layer_norm.gamma),
              tf.convert_to_tensor(layer_norm.beta))


def _dense(dense, scale=1.0):
  dtype = dense.compute_dtype
  kernel = tf.cast(dense.kernel, dtype)
  bias = tf.cast(dense.bias, dtype)
  if scale != 1.0:
    kernel, bias = kernel * tf.cast(scale, dtype), bias * tf.cast(scale, dtype)
  return kernel, bias


def _layer_weights(layer):
  attention, cross = layer.self_attention, layer.cross_attention
  scale = 1.0 / math.sqrt(attention.d_k)
  q, k, v = (_dense(attention.query_dense, scale),
             _dense(attention.key_dense), _dense(attention.value_dense))
  return LayerWeights(
      tf.concat([q[0], k[0], v[0]], axis=1), tf.concat([q[1], k[1], v[1]], 0),
      *_dense(attention.output_dense),
      _norm(layer.self_attention_residual.layer_norm),
      *_dense(cross.query_dense, 1.0 / math.sqrt(cross.d_k)),
      *_dense(cross.output_dense),
      _norm(layer.cross_attention_residual.layer_norm),
      *_dense(layer.feed_forward.inner), *_dense(layer.feed_forward.outer),
      _norm(layer.feed_forward_residual.layer_norm))


def prepare(model, max_positions):
  """The `StepWeights` of a `Transformer` for outputs of up to
  `max_positions` positions (a learned table keeps its own length)."""
  embedding = model.target_embedding
  dtype = embedding.compute_dtype
  table = tf.cast(embedding.embeddings, dtype)
  if embedding.scale:
    table = table * math.sqrt(embedding.d_model)
  positions = model.target_positions
  if hasattr(positions, "position_embeddings"):
    position_table = tf.cast(positions.position_embeddings, dtype)
  else:
    position_table = sinusoid_table(tf.range(max_positions),
                                    embedding.d_model, dtype)
  decoder = model.decoder
  return StepWeights(
      table, position_table,
      tuple(_layer_weights(layer) for layer in decoder.decoder_layers),
      None if decoder.final_norm is None else _norm(decoder.final_norm),
      tf.cast(model.output_embedding.transposed(), dtype))


def read(weights, model, max_positions):
  """The step weights a search uses, as tensors read once before its loop
  so that no step reads a variable: `weights` (an export stores them as
  variables), or when None, `model.step_weights(max_positions)`."""
  if weights is None:
    return model.step_weights(max_positions)
  return tf.nest.map_structure(
      lambda w: w if w is None else tf.convert_to_tensor(w), weights)


def dense(x, kernel, bias, residual=None, relu=False):
  """x kernel + bias [+ residual], ReLU'd if asked: one `_FusedMatMul` for
  x [rows, d_in] (the bias as `BiasAdd`, whose only consumer may be the
  ReLU or the residual add, so that Grappler fuses them)."""
  y = tf.nn.bias_add(tf.matmul(x, kernel), bias)
  if relu:
    y = tf.nn.relu(y)
  return y if residual is None else y + residual


def layer_norm(x, norm, epsilon):
  """LayerNorm over the last axis, in at least float32, as Keras 3
  computes it; returns x's dtype."""
  dtype = x.dtype
  x = tf.cast(x, tf.float32) if dtype != tf.float32 else x
  mean = tf.reduce_mean(x, -1, keepdims=True)
  variance = tf.reduce_mean(tf.math.squared_difference(x, mean), -1,
                            keepdims=True)
  inv = tf.math.rsqrt(variance + epsilon) * tf.cast(norm.gamma, tf.float32)
  y = x * inv + (tf.cast(norm.beta, tf.float32) - mean * inv)
  return tf.cast(y, dtype) if dtype != tf.float32 else y


class Shape(typing.NamedTuple):
  """The sizes the step needs that the weights do not carry."""
  num_heads: int
  d_k: int
  d_v: int
  norm_position: str
  epsilon: float


def shape_of(model):
  layer = model.decoder.decoder_layers[0]
  attention = layer.self_attention
  return Shape(attention.num_heads, attention.d_k, attention.d_v,
               layer.arguments["norm_position"],
               layer.arguments["layer_norm_epsilon"])


def _sublayer(x, shape, norm, fn):
  """The residual connection of section 3.1 (post-norm) or its pre-norm
  variant around `fn(input, residual) = sublayer(input) + residual`."""
  if shape.norm_position == "pre":
    return fn(layer_norm(x, norm, shape.epsilon), x)
  return layer_norm(fn(x, x), norm, shape.epsilon)


def _heads(x, group, heads, depth):
  """[batch * group, heads * depth] -> [batch, heads, group, depth]."""
  return tf.transpose(tf.reshape(x, [-1, group, heads, depth]), [0, 2, 1, 3])


def _merge(heads):
  """[batch, heads, group, depth] -> [batch * group, heads * depth]."""
  _, num_heads, _, depth = heads.shape
  return tf.reshape(tf.transpose(heads, [0, 2, 1, 3]),
                    [-1, num_heads * depth])


def _self_attention_heads(y, weights, shape, group):
  """Q, K and V heads [batch, heads, group, depth] of y [batch * group,
  d_model]: one matmul, and one transpose when d_k = d_v."""
  h, d_k, d_v = shape.num_heads, shape.d_k, shape.d_v
  qkv = dense(y, weights.qkv_kernel, weights.qkv_bias)
  if d_k == d_v:
    return tf.unstack(tf.transpose(tf.reshape(qkv, [-1, group, 3, h, d_k]),
                                   [2, 0, 3, 1, 4]))
  q, k, v = tf.split(qkv, [h * d_k, h * d_k, h * d_v], axis=1)
  return (_heads(q, group, h, d_k), _heads(k, group, h, d_k),
          _heads(v, group, h, d_v))


def layer_step(x, weights, cache, shape, plan, memory_mask, group):
  """One decoder layer at position `plan.step`: x [batch * group, d_model],
  `cache` this layer's (`DecoderLayer.initial_cache`), `plan` the step's
  `decoding_cache.plan_step`; returns (x, cache)."""
  cache = dict(cache)

  def self_attention(y, residual):
    q, k, v = _self_attention_heads(y, weights, shape, group)
    cache["key"] = decoding_cache.write_planned(cache["key"], k, plan)
    cache["value"] = decoding_cache.write_planned(cache["value"], v, plan)
    heads = decoding_cache.attend_blocks(q, cache["key"], cache["value"],
                                         plan)
    return dense(_merge(heads), weights.self_output_kernel,
                 weights.self_output_bias, residual)

  def cross_attention(y, residual):
    q = _heads(dense(y, weights.cross_query_kernel, weights.cross_query_bias),
               group, shape.num_heads, shape.d_k)
    scores = tf.matmul(q, cache["memory_key"], transpose_b=True)
    heads = tf.matmul(masks.masked_softmax(scores, memory_mask),
                      cache["memory_value"])
    return dense(_merge(heads), weights.cross_output_kernel,
                 weights.cross_output_bias, residual)

  def feed_forward(y, residual):
    inner = dense(y, weights.inner_kernel, weights.inner_bias, relu=True)
    return dense(inner, weights.outer_kernel, weights.outer_bias, residual)

  x = _sublayer(x, shape, weights.self_norm, self_attention)
  x = _sublayer(x, shape, weights.cross_norm, cross_attention)
  x = _sublayer(x, shape, weights.feed_forward_norm, feed_forward)
  return x, cache


def decoder_step(weights, shape, ids, step, cache, source_mask):
  """Logits [batch * group, vocab] (float32) of position `step` for the
  tokens `ids` [batch * group, 1] there, and the updated cache (the
  decoder's, from `Decoder.initial_cache`, whose buffers this step writes
  in place: use the returned one). `source_mask` [batch, source_length]."""
  with tf.name_scope("decoder_step"):
    return _decoder_step(weights, shape, ids, step, cache, source_mask)


def _decoder_step(weights, shape, ids, step, cache, source_mask):
  group = decoding_cache.group_size(cache["layer_0"])
  # (Reshapes and broadcasting, not slices: no kernel of their own.)
  x = (tf.gather(weights.embeddings, tf.reshape(ids, [-1]))
       + tf.gather(weights.positions, step))
  ancestors = decoding_cache.mark_step(cache["ancestors"], step)
  plan = decoding_cache.plan_step(ancestors, step, group, shape.num_heads)
  memory_mask = masks.key_padding_mask(source_mask)
  new_cache = {"ancestors": ancestors}
  for i, layer_weights in enumerate(weights.layers):
    name = f"layer_{i}"
    with tf.name_scope(name):
      x, new_cache[name] = layer_step(x, layer_weights, cache[name], shape,
                                      plan, memory_mask, group)
  if weights.final_norm is not None:
    x = layer_norm(x, weights.final_norm, shape.epsilon)
  return tf.cast(tf.matmul(x, weights.output_kernel), tf.float32), new_cache
