"""Decoder layer and decoder stack (section 3.1, Figure 1 right), with the
incremental-decoding cache.

Each layer: masked multi-head self-attention, multi-head attention over the
encoder output ("memory"), then the feed-forward network, each inside a
residual connection with layer normalization.

Masking: decoder self-attention is causal plus padding (position i attends to
real positions <= i); encoder-decoder attention sees every real source token.

Incremental decoding: `Decoder.initial_cache(memory, max_length, group_size)`
preallocates per-layer self-attention keys and values for `max_length`
positions of `group_size` hypotheses per sentence and projects the memory's
keys and values once. Each step (`cached_step`, a method beside `call`, with
fixed outputs) writes one position in place and attends over positions <=
step; every step has the same shapes, so it compiles once under XLA. The
layout and why no step copies the cache: `decoding_cache`. A search runs
the same function in fewer kernels (`fused_step`).
"""

import keras
import tensorflow as tf

from tf_transformer.layers import decoding_cache
from tf_transformer.layers import masks
from tf_transformer.layers import shapes
from tf_transformer.layers.encoder import _TransformerBlock
from tf_transformer.layers.encoder import _TransformerStack


@keras.saving.register_keras_serializable(package="tf_transformer")
class DecoderLayer(_TransformerBlock):
  """Masked self-attention, encoder-decoder attention and feed-forward.

  `call(x, memory, self_attention_mask, cross_attention_mask)`: x is
  [batch, target_length, d_model], memory [batch, source_length, d_model];
  masks are bool, True = may attend, broadcastable to [batch, heads,
  query_length, key_length]. `return_attention_scores=True` returns (x, a
  dict with the "self" and "cross" attention weights).

  `cached_step(x, cache, step, selection, cross_attention_mask)`: one
  position, with fixed outputs (its docstring). The same sub-layers run
  either way: only the self-attention reads and writes the cache.
  """

  def build(self, x_shape, memory_shape=None, self_attention_mask_shape=None,
            cross_attention_mask_shape=None):
    """Weights from the shapes of the call's arguments, named as Keras 3
    names them; only `x_shape` and `memory_shape` decide any."""
    input_shape, memory_shape = x_shape, memory_shape or x_shape
    self.self_attention = self._attention(input_shape[-1], "self_attention")
    self.self_attention.build(input_shape)
    self.cross_attention = self._attention(input_shape[-1], "cross_attention")
    self.cross_attention.build(input_shape, memory_shape)
    self.self_attention_residual = self._residual("self_attention_residual")
    self.cross_attention_residual = self._residual("cross_attention_residual")
    self.feed_forward_residual = self._residual("feed_forward_residual")
    for residual in (self.self_attention_residual,
                     self.cross_attention_residual,
                     self.feed_forward_residual):
      residual.build(input_shape)
    self.feed_forward.build(input_shape)

  def initial_cache(self, memory, max_length, group_size=1):
    """Zero self-attention keys/values for `max_length` positions of
    `group_size` hypotheses per sentence, and the memory's keys/values,
    computed once per sentence (`memory` [batch, source_length, d_model])."""
    batch = tf.shape(memory)[0]
    heads = self.self_attention.num_heads
    zeros = lambda depth: decoding_cache.buffer(
        batch, heads, max_length, group_size, depth, self.compute_dtype)
    memory_key, memory_value = self.cross_attention.project_key_value(memory)
    return {"key": zeros(self.self_attention.d_k),
            "value": zeros(self.self_attention.d_v),
            "memory_key": memory_key, "memory_value": memory_value}

  def call(self, x, memory=None, self_attention_mask=None,
           cross_attention_mask=None, training=None,
           return_attention_scores=False):
    x, weights = self._sublayers(
        x, lambda h: self.self_attention(
            h, attention_mask=self_attention_mask, training=training,
            return_attention_scores=True),
        lambda h: self.cross_attention(
            h, memory, attention_mask=cross_attention_mask,
            training=training, return_attention_scores=True),
        training)
    return (x, weights) if return_attention_scores else x

  def cached_step(self, x, cache, step, selection, cross_attention_mask):
    """Position `step` of `group` hypotheses per sentence, x [batch, group,
    d_model], with this layer's `cache` (`initial_cache`: the memory's keys
    and values are in it), `selection` the step's
    `decoding_cache.selection` and `cross_attention_mask` the source's
    padding. Returns (x, the updated cache, {"self", "cross"} weights); the
    step consumes `cache`."""
    self_cache = {}

    def self_attend(h):
      y, written, weights = self.self_attention.cached_step(
          h, {"key": cache["key"], "value": cache["value"]}, step, selection)
      self_cache.update(written)
      return y, weights

    x, weights = self._sublayers(
        x, self_attend, lambda h: self.cross_attention(
            h, attention_mask=cross_attention_mask,
            key_value=(cache["memory_key"], cache["memory_value"]),
            return_attention_scores=True))
    return x, dict(cache, **self_cache), weights

  def _sublayers(self, x, self_attend, cross_attend, training=None):
    """The three residual sub-layers around the two attentions (each h ->
    (output, weights)): (x, {"self", "cross"} weights)."""
    h = self.self_attention_residual.normalize_input(x)
    y, self_weights = self_attend(h)
    x = self.self_attention_residual(x, y, training=training)
    h = self.cross_attention_residual.normalize_input(x)
    y, cross_weights = cross_attend(h)
    x = self.cross_attention_residual(x, y, training=training)
    h = self.feed_forward_residual.normalize_input(x)
    x = self.feed_forward_residual(x, self.feed_forward(h), training=training)
    return x, {"self": self_weights, "cross": cross_weights}


@keras.saving.register_keras_serializable(package="tf_transformer")
class Decoder(_TransformerStack):
  """A stack of `num_layers` identical decoder layers (N = 6 in the paper).

  `call(x, memory, target_padding_mask=None, memory_padding_mask=None)`:
  x is the embedded target input [batch, target_length, d_model], memory the
  encoder output; padding masks are [batch, length], True at real tokens.
  `return_attention_scores=True` returns (x, the per-layer weight dicts).
  Incremental decoding: `cached_step` (its docstring).
  """

  layer_class = DecoderLayer
  decoder_layers = _TransformerStack.stack_layers

  def build(self, x_shape, memory_shape=None, target_padding_mask_shape=None,
            memory_padding_mask_shape=None):
    for layer in self.decoder_layers:
      layer.build(x_shape, memory_shape)
    if self.final_norm is not None:
      self.final_norm.build(x_shape)

  def initial_cache(self, memory, max_length, group_size=1):
    """The cache for decoding up to `max_length` target positions of
    `group_size` hypotheses for each sentence of `memory` [batch,
    source_length, d_model] (rows sentence-major: row r is hypothesis
    r % group_size of sentence r // group_size)."""
    cache = {f"layer_{i}": layer.initial_cache(memory, max_length, group_size)
             for i, layer in enumerate(self.decoder_layers)}
    cache["ancestors"] = decoding_cache.initial_ancestors(
        tf.shape(memory)[0], group_size, max_length)
    return cache

  @staticmethod
  def reorder_cache(cache, parents):
    """For beam search: row (b, j) continues the hypothesis that was in slot
    `parents[b, j]` ([batch, group] int). Moves no key or value."""
    return dict(cache, ancestors=decoding_cache.reorder(cache["ancestors"],
                                                        parents))

  @staticmethod
  def select_sentences(cache, sentences):
    """The cache of the sentences at positions `sentences` [n] only (a
    search drops the sentences it is done with). Copies their keys and
    values."""
    return {name: (tf.gather(value, sentences) if name == "ancestors"
                   else decoding_cache.select(value, sentences))
            for name, value in cache.items()}

  @staticmethod
  def sentence_axes(cache):
    """The cache's structure with each entry's sentence axis."""
    return {name: 0 if name == "ancestors"
            else dict(decoding_cache.SENTENCE_AXES)
            for name in cache}

  def call(self, x, memory=None, target_padding_mask=None,
           memory_padding_mask=None, training=None,
           return_attention_scores=False):
    if target_padding_mask is not None:
      self_mask = masks.causal_padding_mask(target_padding_mask)
    else:
      self_mask = masks.causal_mask(tf.shape(x)[1])
    cross_attention_mask = (None if memory_padding_mask is None
                            else masks.key_padding_mask(memory_padding_mask))
    all_weights = []
    for layer in self.decoder_layers:
      x, weights = layer(x, memory, self_mask, cross_attention_mask,
                         training=training, return_attention_scores=True)
      all_weights.append(weights)
    if self.final_norm is not None:
      x = self.final_norm(x)
    return (x, all_weights) if return_attention_scores else x

  def cached_step(self, x, cache, step, memory_padding_mask):
    """Position `step` of every row, x [batch * group, 1, d_model], with
    the `cache` of `initial_cache` and the source padding
    `memory_padding_mask` [batch, source_length] (once per sentence; None:
    no padding). Returns (x [batch * group, 1, d_model], the cache, per
    layer {"self", "cross"} weights [batch * group, heads, 1, keys], as a
    teacher-forced pass gives them). The step consumes the cache it is
    given (its buffers are written in place): use the returned one. Each
    layer sees x as [batch, group, d_model] (a query per hypothesis of a
    sentence) and attends over the cache with this step's selection."""
    group_size = decoding_cache.group_size(cache["layer_0"])
    rows, _, d_model = shapes.dims(x)
    x = tf.reshape(x, [rows // group_size, group_size, d_model])
    ancestors = decoding_cache.mark_step(cache["ancestors"], step)
    selection = decoding_cache.selection(ancestors, step, group_size)
    cross_attention_mask = (None if memory_padding_mask is None
                            else masks.key_padding_mask(memory_padding_mask))
    new_cache = {"ancestors": ancestors}
    all_weights = []
    for i, layer in enumerate(self.decoder_layers):
      name = f"layer_{i}"
      x, new_cache[name], weights = layer.cached_step(
          x, cache[name], step, selection, cross_attention_mask)
      all_weights.append(weights)
    if self.final_norm is not None:
      x = self.final_norm(x)
    x = tf.reshape(x, [rows, 1, d_model])
    # Per row, as a teacher-forced pass gives them: [rows, heads, 1, keys].
    return x, new_cache, [{name: _per_row(w) for name, w in weights.items()}
                          for weights in all_weights]


def _per_row(weights):
  """[batch, heads, group, keys] -> [batch * group, heads, 1, keys]."""
  weights = shapes.swap_axes_1_2(weights)
  batch, group, heads, keys = shapes.dims(weights)
  return tf.reshape(weights, [batch * group, heads, 1, keys])
