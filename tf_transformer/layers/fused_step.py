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
  between the sub-layers;
- layer normalization (Ba et al., 2016: gamma * (x - mean) / sqrt(variance
  + epsilon) + beta, in float32) leaves its beta to the affine maps that
  follow it: a matmul's input x + beta is x W + (beta W + b), and in a
  post-norm stack the residual x + beta is added by the next sub-layer's
  output bias. `prepare` folds each beta into those biases once, which
  saves two kernels a normalization. A normalization whose output feeds
  matmuls only (every one of a pre-norm stack, and a post-norm stack's
  last) leaves its gamma to them too: (x gamma) W = x (diag(gamma) W).

The step equals the Keras layers' step to rounding. The Keras layers stay
the path for training, teacher forcing and attention weights;
tests/test_fused_step.py checks that both give the same logits.
"""

import math
import typing

import tensorflow as tf

from tf_transformer.layers import decoding_cache
from tf_transformer.layers import masks
from tf_transformer.layers.embedding import sinusoid_table
from tf_transformer.layers.feed_forward import inner_padding
from tf_transformer.layers.feed_forward import padded_weights


class LayerWeights(typing.NamedTuple):
  """One decoder layer's weights as the step multiplies by them (the
  biases with the betas of the normalizations before them folded in)."""
  qkv_kernel: tf.Tensor  # [d_model, heads * (2 d_k + d_v)], W^Q scaled
  qkv_bias: tf.Tensor
  self_output_kernel: tf.Tensor  # W^O of the self-attention
  self_output_bias: tf.Tensor
  self_gamma: typing.Optional[tf.Tensor]  # the gain of the sub-layer's
  # LayerNorm; None where the matmuls after it have it (pre-norm)
  cross_query_kernel: tf.Tensor  # W^Q of the encoder-decoder attention, scaled
  cross_query_bias: tf.Tensor
  cross_output_kernel: tf.Tensor
  cross_output_bias: tf.Tensor
  cross_gamma: typing.Optional[tf.Tensor]
  inner_kernel: tf.Tensor  # W_1, b_1 of eq. 2, with zero inner units
  # appended where `inner_padding` asks
  inner_bias: tf.Tensor
  outer_kernel: tf.Tensor  # W_2, b_2
  outer_bias: tf.Tensor
  feed_forward_gamma: typing.Optional[tf.Tensor]  # None also for the last
  # layer of a post-norm stack, whose output feeds the output projection only


class StepWeights(typing.NamedTuple):
  """Everything a decoding step multiplies by, prepared once
  (`prepare`)."""
  embeddings: tf.Tensor  # target embeddings times sqrt(d_model) (3.4)
  positions: tf.Tensor  # [max_positions, d_model] (3.5)
  layers: tuple
  output_kernel: tf.Tensor  # [d_model, vocab]: the pre-softmax transform,
  # with the last normalization's gamma folded in
  output_bias: tf.Tensor  # [vocab]: the last normalization's beta, folded


class _Affine(typing.NamedTuple):
  """x W + b in float32, the betas folded in before the cast to the
  compute dtype."""
  kernel: tf.Tensor
  bias: tf.Tensor

  def fold(self, beta, gamma=None):
    """The map of x whose input was x + beta, or x gamma + beta: b +=
    beta W, and W becomes diag(gamma) W."""
    bias = self.bias + tf.linalg.matvec(self.kernel, beta, transpose_a=True)
    kernel = self.kernel if gamma is None else gamma[:, tf.newaxis] * (
        self.kernel)
    return _Affine(kernel, bias)

  def add(self, beta):
    """The map plus beta: b += beta (a post-norm residual's beta)."""
    return self._replace(bias=self.bias + beta)

  def cast(self, dtype):
    return tf.cast(self.kernel, dtype), tf.cast(self.bias, dtype)


def _f32(x):
  return tf.cast(x, tf.float32)


def _affine(dense, scale=1.0):
  return _Affine(_f32(dense.kernel) * scale, _f32(dense.bias) * scale)


def _feed_forward(ff, beta_in, gamma_in, residual_beta, dtype):
  """(W_1, b_1, W_2, b_2) of eq. 2 with the betas and gain folded in, and
  the training layer's zero inner units (`inner_padding`), which make the
  inner matmul 1.7-1.9x faster on an AVX2 AMD EPYC."""
  inner_kernel, inner_bias = _affine(ff.inner).fold(beta_in, gamma_in).cast(
      dtype)
  outer_kernel, outer_bias = _affine(ff.outer).add(residual_beta).cast(dtype)
  return (*padded_weights(inner_kernel, inner_bias, outer_kernel,
                         inner_padding(ff.d_ff, dtype)), outer_bias)


def _layer_weights(layer, beta_in, post_norm, last):
  """(`LayerWeights`, beta_out, gamma_out): `beta_in` the beta the layer's
  input lacks (post-norm: the previous layer's last; zeros for the
  embeddings); beta_out the one its output lacks (post-norm), else zeros;
  gamma_out the gain it lacks (the `last` layer of a post-norm stack), else
  None."""
  attention, cross, ff = (layer.self_attention, layer.cross_attention,
                          layer.feed_forward)
  dtype = attention.compute_dtype
  norms = [residual.layer_norm for residual in (
      layer.self_attention_residual, layer.cross_attention_residual,
      layer.feed_forward_residual)]
  betas = [_f32(norm.beta) for norm in norms]
  gammas = [_f32(norm.gamma) for norm in norms]
  # The gains the step applies: pre-norm, none (each normalization feeds
  # its sub-layer's first matmul only, which takes its gain); post-norm,
  # all but the last layer's last (the output projection takes that one).
  # (Applied ones keep the variables' dtype: a bfloat16 export stores
  # them in bfloat16, as every other weight.)
  kept = [tf.convert_to_tensor(norm.gamma) for norm in norms]
  applied = [None] * 3 if not post_norm else kept[:2] + [
      None if last else kept[2]]
  folded = [None] * 3 if post_norm else gammas
  # Each sub-layer's input lacks the beta before it: post-norm, the
  # previous sub-layer's, which its residual lacks too; pre-norm, its own.
  inputs = [beta_in] + betas[:2] if post_norm else betas
  residuals = inputs if post_norm else [tf.zeros_like(b) for b in betas]
  scale = 1.0 / math.sqrt(attention.d_k)
  qkv = _Affine(*[tf.concat(parts, axis=-1) for parts in zip(
      _affine(attention.query_dense, scale), _affine(attention.key_dense),
      _affine(attention.value_dense))])
  weights = LayerWeights(
      *qkv.fold(inputs[0], folded[0]).cast(dtype),
      *_affine(attention.output_dense).add(residuals[0]).cast(dtype),
      applied[0],
      *_affine(cross.query_dense, 1.0 / math.sqrt(cross.d_k)).fold(
          inputs[1], folded[1]).cast(dtype),
      *_affine(cross.output_dense).add(residuals[1]).cast(dtype),
      applied[1],
      *_feed_forward(ff, inputs[2], folded[2], residuals[2], dtype),
      applied[2])
  if not post_norm:
    return weights, tf.zeros_like(betas[2]), None
  return weights, betas[2], gammas[2] if last else None


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
  post_norm = decoder.decoder_layers[0].arguments["norm_position"] != "pre"
  beta = tf.zeros([embedding.d_model])
  layers = []
  for i, layer in enumerate(decoder.decoder_layers):
    weights, beta, gamma = _layer_weights(
        layer, beta, post_norm, last=i == len(decoder.decoder_layers) - 1)
    layers.append(weights)
  if decoder.final_norm is not None:
    gamma = _f32(decoder.final_norm.gamma)
    beta = _f32(decoder.final_norm.beta)
  output_kernel = _f32(model.output_embedding.transposed())
  output = _Affine(output_kernel,
                   tf.zeros(tf.shape(output_kernel)[1:])).fold(beta, gamma)
  return StepWeights(table, position_table, tuple(layers),
                     *output.cast(dtype))


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
  return y if residual is None else tf.math.add_n([y, residual])


def layer_norm(x, gamma, epsilon):
  """LayerNorm over the last axis, in at least float32, without its beta
  (which the affine maps after it add, `prepare`): gamma * (x - mean) /
  sqrt(variance + epsilon), eight kernels, or seven without gamma (None:
  the matmuls after it have it); returns x's dtype."""
  dtype = x.dtype
  x = tf.cast(x, tf.float32) if dtype != tf.float32 else x
  centered = x - tf.reduce_mean(x, -1, keepdims=True)
  variance = tf.reduce_mean(tf.square(centered), -1, keepdims=True)
  y = centered * tf.math.rsqrt(variance + epsilon)
  if gamma is not None:
    y *= tf.cast(gamma, tf.float32)
  return tf.cast(y, dtype) if dtype != tf.float32 else y


class Shape(typing.NamedTuple):
  """The sizes the step needs that the weights do not carry."""
  num_heads: int
  d_k: int
  d_v: int
  norm_position: str
  epsilon: float
  final_norm: bool  # a normalization after the last layer (pre-norm)


def shape_of(model):
  decoder = model.decoder
  layer = decoder.decoder_layers[0]
  attention = layer.self_attention
  return Shape(attention.num_heads, attention.d_k, attention.d_v,
               layer.arguments["norm_position"],
               layer.arguments["layer_norm_epsilon"],
               decoder.final_norm is not None)


def _sublayer(x, shape, gamma, fn):
  """The residual connection of section 3.1 (post-norm) or its pre-norm
  variant around `fn(input, residual) = sublayer(input) + residual`."""
  if shape.norm_position == "pre":
    return fn(layer_norm(x, gamma, shape.epsilon), x)
  return layer_norm(fn(x, x), gamma, shape.epsilon)


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

  x = _sublayer(x, shape, weights.self_gamma, self_attention)
  x = _sublayer(x, shape, weights.cross_gamma, cross_attention)
  x = _sublayer(x, shape, weights.feed_forward_gamma, feed_forward)
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
  ancestors, plan = decoding_cache.plan_step(cache["ancestors"], step, group,
                                             shape.num_heads)
  memory_mask = masks.key_padding_mask(source_mask)
  new_cache = {"ancestors": ancestors}
  for i, layer_weights in enumerate(weights.layers):
    name = f"layer_{i}"
    with tf.name_scope(name):
      x, new_cache[name] = layer_step(x, layer_weights, cache[name], shape,
                                      plan, memory_mask, group)
  if shape.final_norm:  # its gain is the output kernel's
    x = layer_norm(x, None, shape.epsilon)
  logits = dense(x, weights.output_kernel, weights.output_bias)
  return tf.cast(logits, tf.float32), new_cache
