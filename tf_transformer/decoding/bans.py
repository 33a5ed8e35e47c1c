"""Tokens a search may not pick at a step, as NMT toolkits ban them:

- `min_length`: EOS is banned until an output has that many tokens after its
  target prefix (CTranslate2's `min_decoding_length`, fairseq's `--min-len`);
- `no_repeat_ngram_size`: a token that would complete an n-gram the output
  already holds is banned (CTranslate2's and fairseq's
  `no_repeat_ngram_size`, Transformers' `no_repeat_ngram_size`), against the
  loops of a weak or out-of-domain model.

`apply` rewrites one step's logits as `prefix.force` does (`move_to_pad`):
a banned token's probability moves onto PAD, which no search outputs but
whose probability counts in the normalization. So a search's scores stay
the model's log P(Y|X) (what `bin/score.py` gives its outputs), where
CTranslate2 renormalizes over the tokens left. With both settings 0 (the
default) no search is changed.

A search keeps its outputs so far in a `history` [rows, max_length + 1]
buffer: the decoder's start token (BOS) at position 0, then the tokens
chosen; at step `step` (the position being chosen) positions 0..step hold
something. The start token never counts in an n-gram.
"""

import typing

import tensorflow as tf

from tf_transformer.decoding.limits import NEG_INF
from tf_transformer.special_ids import EOS_ID, PAD_ID


class Bans(typing.NamedTuple):
  """A search's bans; 0 turns each off."""
  min_length: int = 0
  no_repeat_ngram_size: int = 0

  @property
  def any(self) -> bool:
    return bool(self.min_length or self.no_repeat_ngram_size)

  @property
  def need_history(self) -> bool:
    return self.no_repeat_ngram_size > 0


def write(history, step, ids):
  """`history` [..., length] with `ids` [...] at `step` (its shape kept)."""
  ids = tf.reshape(ids, tf.concat([tf.shape(history)[:-1], [1]], 0))
  return tf.where(tf.range(tf.shape(history)[-1]) == step, ids, history)


def repeated_ngram_tokens(history, step, size, vocab):
  """[rows, vocab] bool: the tokens that would complete, at position
  `step` + 1 of `history`, an n-gram of `size` tokens already in it.

  Args:
    history: [rows, length] int32, positions 1..step the outputs so far
      (position 0 the start token, not counted).
    step: a scalar int32, the output position being chosen (so `history`
      holds `step` outputs).
    size: n, a Python int >= 2.
    vocab: the logits' width (an int or a scalar tensor).
  Returns:
    True where a token is banned.
  """
  length = tf.shape(history)[1]
  width = tf.maximum(length - size + 1, 0)  # n-grams starting at 0..width-1
  # The last size - 1 outputs (positions step - size + 2 .. step).
  last = step - size + 2
  matches = tf.ones([tf.shape(history)[0], width], tf.bool)
  for offset in range(size - 1):
    token = tf.gather(history, tf.maximum(last + offset, 0), axis=1)
    matches &= tf.equal(history[:, offset:offset + width],
                        token[:, tf.newaxis])
  starts = tf.range(width)
  # An earlier n-gram: after the start token, its last token at most at
  # `step` (a written one); and the suffix lies after the start token too.
  matches &= ((starts >= 1) & (starts + size - 1 <= step))[tf.newaxis]
  matches &= last >= 1
  following = history[:, size - 1:size - 1 + width]
  rows = tf.broadcast_to(tf.range(tf.shape(history)[0])[:, tf.newaxis],
                         tf.shape(following))
  where = tf.where(matches)
  indices = tf.stack([tf.gather_nd(rows, where),
                      tf.gather_nd(following, where)], axis=1)
  counts = tf.scatter_nd(indices, tf.ones(tf.shape(where)[:1], tf.int32),
                         tf.stack([tf.shape(history)[0], vocab]))
  return counts > 0


def apply(logits, step, bans: Bans, history=None, prefix_lengths=None):
  """One step's logits with the banned tokens' probability moved to PAD.

  Args:
    logits: [rows, vocab] float of step `step` (the output position).
    step: a scalar int32.
    bans: the `Bans`.
    history: [rows, length] int32 (see the module docstring); needed with
      `no_repeat_ngram_size`.
    prefix_lengths: [rows] int32, each row's forced target prefix: no ban
      while a row is in its prefix, and `min_length` counts after it.
  Returns:
    [rows, vocab], the same dtype.
  """
  if not bans.any:
    return logits
  vocab = logits.shape[-1] or tf.shape(logits)[-1]  # a shortlist's varies
  column = tf.range(vocab)[tf.newaxis]
  if prefix_lengths is None:
    prefix_lengths = tf.zeros(tf.shape(logits)[:1], tf.int32)
  after_prefix = (step >= prefix_lengths)[:, tf.newaxis]
  banned = tf.zeros_like(logits, tf.bool)
  if bans.min_length:
    short = (step < prefix_lengths + bans.min_length)[:, tf.newaxis]
    banned |= short & (column == EOS_ID)
  if bans.no_repeat_ngram_size:
    banned |= repeated_ngram_tokens(history, step, bans.no_repeat_ngram_size,
                                    vocab) & after_prefix
  return move_to_pad(logits, banned)


def move_to_pad(logits, banned):
  """`logits` with the probability of the `banned` tokens added to PAD's
  and theirs NEG_INF: PAD is never output, and the normalization (a
  softmax's denominator) is unchanged, so scores stay log P(Y|X).

  Args:
    logits: [rows, vocab] float.
    banned: bool, broadcastable to `logits`; PAD's column is ignored.
  Returns:
    [rows, vocab], the same dtype.
  """
  pad = tf.range(tf.shape(logits)[-1]) == PAD_ID
  banned &= ~pad
  moved = tf.reduce_logsumexp(tf.where(banned | pad, logits, NEG_INF), -1,
                              keepdims=True)
  return tf.where(pad, moved, tf.where(banned, NEG_INF, logits))
