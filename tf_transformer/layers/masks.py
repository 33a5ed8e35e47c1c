"""Attention masks, with one convention everywhere: True = may attend.

Masks are built explicitly from token ids and passed down; Keras' implicit
`_keras_mask` propagation is never used. Shapes broadcast against attention
scores of shape [batch, heads, query_length, key_length]. Written with
`keras.ops`, so they run on every Keras backend.
"""

import keras
import ml_dtypes

from tf_transformer.special_ids import PAD_ID


def padding_mask(ids, pad_id=PAD_ID):
  """[batch, length] bool: True where `ids` is a real token."""
  return keras.ops.not_equal(ids, pad_id)


def key_padding_mask(key_mask):
  """[batch, key_length] -> [batch, 1, 1, key_length]: every query may attend
  to each real key (encoder self-attention, encoder-decoder attention)."""
  return keras.ops.expand_dims(keras.ops.expand_dims(key_mask, 1), 1)


def causal_mask(length):
  """[1, 1, length, length]: position i may attend to positions <= i
  (decoder self-attention, section 3.2.3)."""
  positions = keras.ops.arange(length)
  return (positions[None, :] <= positions[:, None])[None, None]


def causal_padding_mask(key_mask):
  """Causal and padding mask for decoder self-attention over [batch, length]."""
  return keras.ops.logical_and(causal_mask(keras.ops.shape(key_mask)[1]),
                               key_padding_mask(key_mask))


def lowest(dtype):
  """The most negative finite value of a float dtype (bfloat16 included)."""
  return float(ml_dtypes.finfo(keras.backend.standardize_dtype(dtype)).min)


def masked_softmax(scores, mask):
  """Softmax over the last axis where `mask` is False gets no weight.

  Masked scores are replaced (not added to) with the most negative value of
  the scores' dtype, so float16 and bfloat16 never overflow. The softmax runs
  in float32 and the result returns in the scores' dtype. A row with no key
  to attend to (a padded query over a padded key) gets uniform weights rather
  than NaN; its output is never used. Over a single key every weight is 1.
  """
  if scores.shape[-1] == 1:
    return keras.ops.ones_like(scores)
  if mask is not None:
    scores = keras.ops.where(mask, scores, lowest(scores.dtype))
  return keras.ops.cast(keras.ops.softmax(keras.ops.cast(scores, "float32")),
                        scores.dtype)
