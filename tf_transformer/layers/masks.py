"""Attention masks, with one convention everywhere: True = may attend.

Masks are built explicitly from token ids and passed down; Keras' implicit
`_keras_mask` propagation is never used. Shapes broadcast against attention
scores of shape [batch, heads, query_length, key_length].
"""

import tensorflow as tf

from tf_transformer.special_ids import PAD_ID


def padding_mask(ids, pad_id=PAD_ID):
  """[batch, length] bool: True where `ids` is a real token."""
  return tf.not_equal(ids, pad_id)


def key_padding_mask(key_mask):
  """[batch, key_length] -> [batch, 1, 1, key_length]: every query may attend
  to each real key (encoder self-attention, encoder-decoder attention)."""
  return tf.expand_dims(tf.expand_dims(key_mask, 1), 1)


def causal_mask(length):
  """[1, 1, length, length]: position i may attend to positions <= i
  (decoder self-attention, section 3.2.3)."""
  positions = tf.range(length)
  return (positions[tf.newaxis, :] <= positions[:, tf.newaxis])[
      tf.newaxis, tf.newaxis]


def causal_padding_mask(key_mask):
  """Causal and padding mask for decoder self-attention over [batch, length]."""
  return tf.logical_and(causal_mask(tf.shape(key_mask)[1]),
                        key_padding_mask(key_mask))


def masked_softmax(scores, mask):
  """Softmax over the last axis where `mask` is False gets no weight.

  Masked scores are replaced (not added to) with the most negative value of
  the scores' dtype, so float16 and bfloat16 never overflow. The softmax runs
  in float32 and the result returns in the scores' dtype. A row with no key
  to attend to (a padded query over a padded key) gets uniform weights rather
  than NaN; its output is never used.
  """
  if mask is not None:
    scores = tf.where(mask, scores, scores.dtype.min)
  return tf.cast(tf.nn.softmax(tf.cast(scores, tf.float32)), scores.dtype)
