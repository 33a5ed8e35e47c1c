"""Beam search on a `Transformer`: encode once, then one cached decoder step
per output token for batch * beam rows."""

import tensorflow as tf

from tf_transformer.decoding.beam_search import beam_search, tile_beams


def model_beam_search(model, source_ids, beam_size=4, alpha=0.6,
                      max_length_offset=50, max_length=None):
  """(ids [batch, beam, length], scores [batch, beam]) for `source_ids`
  [batch, source_length] (EOS-terminated, PAD-padded). Each output has at
  most its source length + `max_length_offset` tokens; `max_length` fixes
  the buffers' length (a static shape, for XLA), else it is the longest
  limit of the batch."""
  batch_size = tf.shape(source_ids)[0]
  memory, source_mask = model.encode(source_ids)
  limits = tf.reduce_sum(tf.cast(source_mask, tf.int32), 1) + max_length_offset
  if max_length is None:
    max_length = tf.maximum(tf.reduce_max(limits), 1)  # an empty batch too
  memory = tile_beams(memory, beam_size)
  source_mask = tile_beams(source_mask, beam_size)
  cache = model.initial_cache(memory, max_length)

  def symbols_to_logits(ids, step, cache):
    return model.decode(ids, None, source_mask, cache=cache, step=step)

  return beam_search(symbols_to_logits, cache, batch_size, limits, max_length,
                     beam_size, alpha,
                     static_cache_keys=("memory_key", "memory_value"))
