"""Section 6.1's maximum output length, shared by every search: each
sentence's output has at most its source length + `max_length_offset`
tokens (EOS included), and a search's buffers hold the batch's longest."""

import tensorflow as tf


def output_limits(source_mask, max_length_offset, max_length=None):
  """(limits [batch] int32, max_length) for the source padding mask
  [batch, source_length]. `max_length` given (a shape for XLA) is kept;
  else it is the longest limit, at least 1 (an empty batch too)."""
  limits = tf.reduce_sum(tf.cast(source_mask, tf.int32), 1) + max_length_offset
  if max_length is None:
    max_length = tf.maximum(tf.reduce_max(limits), 1)
  return limits, max_length


def check_sampling(temperature, top_k):
  """Raises ValueError naming the setting if sampling cannot use it."""
  if temperature <= 0:
    raise ValueError(f"temperature={temperature}: must be > 0")
  if top_k < 0:
    raise ValueError(f"top_k={top_k}: must be >= 0 (0 = whole vocabulary)")
