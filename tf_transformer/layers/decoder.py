"""Decoder layer and decoder stack (section 3.1, Figure 1 right), with the
incremental-decoding cache.

Each layer: masked multi-head self-attention, multi-head attention over the
encoder output ("memory"), then the feed-forward network, each inside a
residual connection with layer normalization.

Masking: decoder self-attention is causal plus padding (position i attends to
real positions <= i); encoder-decoder attention sees every real source token.

Incremental decoding: `Decoder.initial_cache(memory, max_length)` preallocates
per-layer self-attention keys and values for `max_length` positions and
projects the memory's keys and values once. Each step writes one position of
the cache (`tf.where` on a position mask, so every step has the same static
shapes and compiles once under XLA) and attends over positions <= step.
"""

import keras
import tensorflow as tf

from tf_transformer.layers import masks
from tf_transformer.layers.encoder import _TransformerBlock
from tf_transformer.layers.encoder import _TransformerStack


def write_cache(cache, new, step):
  """Writes `new` [batch, heads, 1, depth] at position `step` of `cache`
  [batch, heads, max_length, depth]."""
  shape = tf.shape(cache)
  batch, heads = shape[0], shape[1]
  # (b, h, step) for every row and head: the op updates the loop's buffer in
  # place, where tf.where would rewrite all max_length positions each step.
  rows = tf.stack(tf.meshgrid(tf.range(batch), tf.range(heads),
                              indexing="ij"), axis=-1)
  indices = tf.concat([rows, tf.fill([batch, heads, 1], step)], axis=-1)
  return tf.tensor_scatter_nd_update(cache, indices, new[:, :, 0])


@keras.saving.register_keras_serializable(package="tf_transformer")
class DecoderLayer(_TransformerBlock):
  """Masked self-attention, encoder-decoder attention and feed-forward.

  `call(x, memory, self_attention_mask, cross_attention_mask, cache=None, step=None)`:
  x is [batch, target_length, d_model], memory [batch, source_length, d_model];
  masks are bool, True = may attend, broadcastable to
  [batch, heads, query_length, key_length]. With a `cache` (from
  `initial_cache`) x holds the one position `step` and the call returns
  (output, updated_cache); `memory` is then unused (its keys and values are
  in the cache). `return_attention_scores=True` appends a dict with the
  "self" and "cross" attention weights.
  """

  def build(self, x_shape, memory_shape=None):
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

  def initial_cache(self, memory, max_length):
    """Zero self-attention keys/values for `max_length` positions, and the
    memory's keys/values, computed once per source."""
    batch = tf.shape(memory)[0]
    heads = self.self_attention.num_heads
    zeros = lambda depth: tf.zeros([batch, heads, max_length, depth],
                                   self.compute_dtype)
    memory_key, memory_value = self.cross_attention.project_key_value(memory)
    return {"key": zeros(self.self_attention.d_k),
            "value": zeros(self.self_attention.d_v),
            "memory_key": memory_key, "memory_value": memory_value}

  def call(self, x, memory=None, self_attention_mask=None, cross_attention_mask=None,
           cache=None, step=None, training=None,
           return_attention_scores=False):
    h = self.self_attention_residual.normalize_input(x)
    self_key_value = memory_key_value = None
    if cache is not None:
      new_key, new_value = self.self_attention.project_key_value(h)
      cache = dict(cache, key=write_cache(cache["key"], new_key, step),
                   value=write_cache(cache["value"], new_value, step))
      self_key_value = (cache["key"], cache["value"])
      memory_key_value = (cache["memory_key"], cache["memory_value"])
    y, self_weights = self.self_attention(
        h, attention_mask=self_attention_mask, key_value=self_key_value,
        training=training, return_attention_scores=True)
    x = self.self_attention_residual(x, y, training=training)

    h = self.cross_attention_residual.normalize_input(x)
    y, cross_weights = self.cross_attention(
        h, memory, attention_mask=cross_attention_mask, key_value=memory_key_value,
        training=training, return_attention_scores=True)
    x = self.cross_attention_residual(x, y, training=training)

    h = self.feed_forward_residual.normalize_input(x)
    x = self.feed_forward_residual(x, self.feed_forward(h), training=training)

    outputs = (x,) if cache is None else (x, cache)
    if return_attention_scores:
      outputs += ({"self": self_weights, "cross": cross_weights},)
    return outputs[0] if len(outputs) == 1 else outputs


@keras.saving.register_keras_serializable(package="tf_transformer")
class Decoder(_TransformerStack):
  """A stack of `num_layers` identical decoder layers (N = 6 in the paper).

  `call(x, memory, target_padding_mask=None, memory_padding_mask=None)`:
  x is the embedded target input [batch, target_length, d_model], memory the
  encoder output; padding masks are [batch, length], True at real tokens.
  For incremental decoding pass `cache` (from `initial_cache`) and `step`:
  x is then [batch, 1, d_model] and the call returns (output, cache).
  `return_attention_scores=True` appends the list of per-layer weight dicts.
  """

  layer_class = DecoderLayer
  decoder_layers = _TransformerStack.stack_layers

  def build(self, x_shape, memory_shape=None):
    for layer in self.decoder_layers:
      layer.build(x_shape, memory_shape)
    if self.final_norm is not None:
      self.final_norm.build(x_shape)

  def initial_cache(self, memory, max_length):
    """The cache for decoding up to `max_length` target positions."""
    return {f"layer_{i}": layer.initial_cache(memory, max_length)
            for i, layer in enumerate(self.decoder_layers)}

  def call(self, x, memory=None, target_padding_mask=None,
           memory_padding_mask=None, cache=None, step=None, training=None,
           return_attention_scores=False):
    if cache is not None:
      max_length = tf.shape(cache["layer_0"]["key"])[2]
      self_mask = masks.step_mask(step, max_length)
    elif target_padding_mask is not None:
      self_mask = masks.causal_padding_mask(target_padding_mask)
    else:
      self_mask = masks.causal_mask(tf.shape(x)[1])
    cross_attention_mask = (None if memory_padding_mask is None
                   else masks.key_padding_mask(memory_padding_mask))
    new_cache, all_weights = {}, []
    for i, layer in enumerate(self.decoder_layers):
      name = f"layer_{i}"
      outputs = layer(x, memory, self_mask, cross_attention_mask,
                      cache=None if cache is None else cache[name], step=step,
                      training=training, return_attention_scores=True)
      if cache is None:
        x, weights = outputs
      else:
        x, new_cache[name], weights = outputs
      all_weights.append(weights)
    if self.final_norm is not None:
      x = self.final_norm(x)
    outputs = (x,) if cache is None else (x, new_cache)
    if return_attention_scores:
      outputs += (all_weights,)
    return outputs[0] if len(outputs) == 1 else outputs
