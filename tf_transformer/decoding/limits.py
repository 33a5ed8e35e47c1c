"""Section 6.1's maximum output length, shared by every search: each
sentence's output has at most its source length + `max_length_offset`
tokens (EOS included), and a search's buffers hold the batch's longest;
and what else every search holds to: special_ids.never_output() is never an
output."""

import numpy as np
import tensorflow as tf

from tf_transformer.special_ids import NEVER_OUTPUT

# The score of what a search must never pick: a finite float32, so that
# sums and differences of it stay finite (whatever the model's dtype).
NEG_INF = -1e9


def output_limits(source_mask, max_length_offset, max_length=None):
  """The most tokens each output may have (EOS included).

  Args:
    source_mask: [batch, source_length] bool, True at real tokens.
    max_length_offset: the limit is the source length (EOS included) + this
      (+50 in section 6.1).
    max_length: a fixed buffer length (a shape for XLA), kept as given.
  Returns:
    (limits [batch] int32, max_length: as given, else the longest limit, at
    least 1, an empty batch too).
  """
  limits = tf.reduce_sum(tf.cast(source_mask, tf.int32), 1) + max_length_offset
  if max_length is None:
    max_length = tf.maximum(tf.reduce_max(limits), 1)
  return limits, max_length


def never_output(vocab_size, ids=NEVER_OUTPUT):
  """The tokens a search never outputs (special_ids.never_output()).

  Args:
    vocab_size: a Python int (the table is then a constant: a step looks its
      ids up with one gather, no kernel to build it) or a tensor.
    ids: those tokens, the model's `special_ids.never_output(...)`.
  Returns:
    bool [vocab_size], True at those tokens.
  """
  if isinstance(vocab_size, int):
    return tf.constant(np.isin(np.arange(vocab_size), ids))
  return tf.reduce_any(tf.one_hot(ids, vocab_size, on_value=True,
                                  off_value=False), axis=0)
