"""The one cached decoding step of the decoder stack (section 3.1, Figure 1
right): what `Transformer.decode` computes for the last position of a
target, one position at a time over a cache (`decoding/cache.py`), as few
kernels.

    step = Step(model)                   # static=True under XLA
    weights = step.prepare(max_length)   # once per search, or per export
    memory, source_mask = step.encode(source_ids)
    cache = step.initial_cache(weights, memory, max_length, group_size)
    logits, cache = step(ids, position, cache, source_mask, weights)
    cache = step.reorder(cache, parents)  # beam search

A search runs the decoder once per output token on a handful of rows, where
each TensorFlow kernel does a few microseconds' work and the executor's cost
per kernel counts as much. So every projection is a 2-D `MatMul` followed by
`BiasAdd`, which Grappler's remapper fuses into one `_FusedMatMul` (with the
feed-forward ReLU, and under oneDNN the residual `Add`), where Keras' `Dense`
on [batch, group, d_model] is a `BatchMatMulV2` plus an `Add`, which never
fuse; the weights are tensors read once per request (`step_weights.py`:
fused, scaled and with the normalizations' betas folded in), not variables
read at every step; and activations stay [rows, d_model] from layer to
layer. A change to a sub-layer goes into its Keras layer (`call`, for
training) and here; tests/test_step.py holds the two equal at every
position.
"""

import typing

import keras
import tensorflow as tf

from tf_transformer.decoding import cache as cache_lib
from tf_transformer.decoding import encoding
from tf_transformer.decoding.fused_ops import dense
from tf_transformer.decoding.fused_ops import layer_norm
from tf_transformer.decoding.fused_ops import residual
from tf_transformer.decoding import step_weights
from tf_transformer.layers import masks
from tf_transformer.decoding import shapes


class Shape(typing.NamedTuple):
  """The sizes the step needs that its weights do not carry."""
  num_heads: int
  d_k: int
  d_v: int
  norm_position: str  # "post" (section 3.1) or "pre"
  epsilon: float
  final_norm: bool  # a normalization after the last layer (pre-norm)
  static: bool  # every shape static, for XLA (`decoding/cache.py`)
  activation: str = "relu"  # the feed-forward's (config.ACTIVATIONS)
  zero_start: bool = False  # position 0 embeds a zero vector, not BOS
  positional_encoding: str = "sinusoidal"  # (config.POSITIONAL_ENCODINGS)
  embedding_scale: float = 1.0  # the target embeddings' multiplier (3.4)


def shape_of(named, static=False) -> Shape:
  """The sizes the step needs that its weights do not carry.

  Args:
    named: a model's `named_weights.Model`.
    static: keep every shape static, for XLA.
  Returns:
    Its `Shape`.
  """
  attention = named.decoder.layers[0].self_attention
  heads = attention.num_heads
  return Shape(heads, attention.query.kernel.shape[-1] // heads,
               attention.value.kernel.shape[-1] // heads,
               named.norm_position, named.epsilon,
               named.decoder.final_norm is not None, static, named.activation,
               named.decoder_start == "zero", named.positional_encoding,
               named.embedding_scale)


def _sublayer(x, shape, gamma, fn):
  """`fused_ops.residual` around `fn`, its norm without beta (folded into
  the biases after it, `step_weights.py`)."""
  return residual(x, shape.norm_position,
                  lambda y: layer_norm(y, gamma, shape.epsilon), fn)


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
  """One decoder layer at position `plan.step` (section 3.1: masked
  self-attention over the cache, attention over the memory, feed-forward,
  each in its residual block).

  Args:
    x: [batch * group, d_model], the layer's input at this position.
    weights: this layer's `StepLayer`.
    cache: this layer's cache.
    shape: the model's `Shape`.
    plan: the step's `cache.plan_step`.
    memory_mask: [batch, 1, 1, source_length] bool.
    group: hypotheses a sentence.
  Returns:
    (x [batch * group, d_model], the layer's updated cache).
  """
  cache = dict(cache)

  def self_attention(y, residual):
    q, k, v = _self_attention_heads(y, weights, shape, group)
    cache["key"] = cache_lib.write(cache["key"], k, plan)
    cache["value"] = cache_lib.write(cache["value"], v, plan)
    heads = cache_lib.attend(q, cache["key"], cache["value"], plan)
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
    inner = dense(y, weights.inner_kernel, weights.inner_bias,
                  activation=shape.activation)
    return dense(inner, weights.outer_kernel, weights.outer_bias, residual)

  x = _sublayer(x, shape, weights.self_gamma, self_attention)
  x = _sublayer(x, shape, weights.cross_gamma, cross_attention)
  x = _sublayer(x, shape, weights.feed_forward_gamma, feed_forward)
  return x, cache


def initial_cache(weights, shape, memory, max_length, group_size=1):
  """The cache (`decoding/cache.py`) before the first step; the memory's
  keys and values of every layer are projected here, once.

  Args:
    weights: `StepWeights`.
    shape: the model's `Shape`.
    memory: the encoder output [batch, source_length, d_model].
    max_length: target positions to hold.
    group_size: hypotheses per sentence (rows sentence-major).
  Returns:
    {"ancestors", "layer_0", ...}: the ancestor table and each layer's
    buffers.
  """
  batch, length, _ = shapes.dims(memory)

  def project(kernel, bias, depth):  # as `Dense` computes it
    x = keras.ops.matmul(memory, kernel) + bias
    return shapes.swap_axes_1_2(
        tf.reshape(x, [batch, length, shape.num_heads, depth]))

  cache = {"ancestors": cache_lib.initial_ancestors(batch, group_size,
                                                    max_length)}
  for i, layer in enumerate(weights.layers):
    cache[f"layer_{i}"] = {
        "key": cache_lib.buffer(batch, shape.num_heads, max_length,
                                group_size, shape.d_k, memory.dtype,
                                shape.static),
        "value": cache_lib.buffer(batch, shape.num_heads, max_length,
                                  group_size, shape.d_v, memory.dtype,
                                  shape.static),
        "memory_key": project(layer.cross_key_kernel, layer.cross_key_bias,
                              shape.d_k),
        "memory_value": project(layer.cross_value_kernel,
                                layer.cross_value_bias, shape.d_v)}
  return cache


def decoder_step(weights, shape, ids, step, cache, source_mask):
  """One position of the decoder stack for every hypothesis (section
  3.2.3: each position attends to the cached ones before it).

  Args:
    weights: `StepWeights` (`step_weights.prepare`).
    shape: the model's `Shape`.
    ids: [batch * group, 1] int32, the tokens at position `step`.
    step: the position, a scalar int32.
    cache: from `initial_cache` or the previous step; its buffers are
      written in place: use the returned one.
    source_mask: [batch, source_length] bool, True at real tokens.
  Returns:
    (logits [batch * group, vocab] float32, the updated cache).
  """
  with tf.name_scope("decoder_step"):
    group = cache_lib.group_size(cache["layer_0"])
    # (Reshapes and broadcasting, not slices: no kernel of their own.)
    x = tf.gather(weights.embeddings, tf.reshape(ids, [-1]))
    scale = shape.embedding_scale  # (3.4)
    if shape.zero_start:  # (ModelConfig.decoder_start), one kernel for both
      x *= tf.where(step > 0, tf.constant(scale, x.dtype),
                    tf.zeros([], x.dtype))
    elif scale != 1.0:
      x *= tf.constant(scale, x.dtype)
    x += tf.gather(weights.positions, step)
    ancestors, plan = cache_lib.plan_step(cache["ancestors"], step, group,
                                          shape.num_heads, shape.static)
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


def read(decoder, stored, max_positions):
  """The step weights a search uses, as tensors read once before its
  loop, so that no step reads a variable.

  Args:
    decoder: a `Step` or an `EnsembleStep`.
    stored: the weights an export keeps as variables, or None.
    max_positions: outputs of up to this many positions (when None).
  Returns:
    `stored`, else `decoder.prepare(max_positions)`, as tensors.
  """
  weights = decoder.prepare(max_positions) if stored is None else stored
  return tf.nest.map_structure(
      lambda w: w if w is None else tf.convert_to_tensor(w), weights)


class Step:
  """What a search asks of one `Transformer`: its encoder, and the step
  above with its weights and cache (the module docstring's use).

  Args:
    model: a `Transformer`.
    static: keep every shape static, for XLA.
  """

  reorder = staticmethod(cache_lib.reorder)
  select = staticmethod(cache_lib.select)
  sentence_axes = staticmethod(cache_lib.sentence_axes)

  def __init__(self, model, static=False):
    self.model = model
    self.shape = shape_of(model.named_weights(), static)

  @property
  def config(self):
    return self.model.config

  def encode(self, source_ids, weights=None):
    """(memory, source padding mask) of `Transformer.encode`: on the real
    tokens only (`encoding.encode`) given the prepared `weights` with their
    encoder's, else (and under XLA, whose shapes must not depend on the
    values) by the Keras layers."""
    if weights is None or weights.encoder is None or self.shape.static:
      return self.model.encode(source_ids)
    return encoding.encode(weights.encoder, self.shape, source_ids,
                           self.model.named_weights())

  def prepare(self, max_positions) -> step_weights.StepWeights:
    """The step's weights for outputs of up to `max_positions` tokens, read
    from the model's variables: once per search, or once per export."""
    return step_weights.prepare(self.model.named_weights(),
                                self.model.compute_dtype, max_positions)

  def initial_cache(self, weights, memory, max_length, group_size=1):
    return initial_cache(weights, self.shape, memory, max_length, group_size)

  def __call__(self, ids, position, cache, source_mask, weights):
    """(logits [rows, vocab] float32, cache) of `decoder_step`."""
    return decoder_step(weights, self.shape, ids, position, cache,
                        source_mask)
