"""A target prefix forced on the search (autocompletion, interactive
post-editing: CTranslate2's `target_prefix`, fairseq's `--prefix-size`):
the first tokens of each output are given, and the search completes them.

`force(logits, step, prefix)` rewrites one decoding step's logits so that a
row whose prefix is not yet used up can only take its next prefix token,
with the probability the model gives it: the rest of the row's
probability mass is moved onto PAD, which no search ever outputs
(special_ids.NEVER_OUTPUT) but whose probability counts in the
normalization. So scores stay log P(output | input) (prefix tokens
included), and rows without a prefix, or past it, are left exactly as they
were: an empty prefix gives exactly the plain search.
"""

import typing

import tensorflow as tf

from tf_transformer.decoding import bans as bans_lib


class Prefix(typing.NamedTuple):
  """Per sentence: `ids` [batch, P] int32 (PAD-padded) and `lengths`
  [batch] int32."""
  ids: tf.Tensor
  lengths: tf.Tensor


def from_ragged(ids: tf.RaggedTensor) -> Prefix:
  """A `Prefix` of ragged target ids.

  Args:
    ids: [batch, (P)] ints, each sentence's forced first tokens.
  Returns:
    The `Prefix`, PAD-padded.
  """
  return Prefix(tf.cast(ids.to_tensor(), tf.int32),
                tf.cast(ids.row_lengths(), tf.int32))


def select(prefix: Prefix, sentences) -> Prefix:
  """The prefixes of some sentences.

  Args:
    prefix: a `Prefix`.
    sentences: [n] int, positions in the batch.
  Returns:
    Their `Prefix`, in that order.
  """
  return Prefix(tf.gather(prefix.ids, sentences),
                tf.gather(prefix.lengths, sentences))


def force(logits, step, prefix: Prefix, group_size=1):
  """Each row's next prefix token forced while it has one.

  The forced token keeps its own log-probability; the rest of the mass goes
  to PAD, which no search outputs, so that scores stay log P(Y|X).

  Args:
    logits: [rows, vocab] float32 of decoding step `step`, rows being the
      sentences' hypotheses, `group_size` consecutive rows a sentence.
    step: the position, a scalar int32.
    prefix: the sentences' `Prefix`.
    group_size: hypotheses a sentence.
  Returns:
    [rows, vocab] float32.
  """
  ids = tf.repeat(prefix.ids, group_size, axis=0)
  forcing = tf.repeat(prefix.lengths, group_size, axis=0) > step
  column = tf.minimum(step, tf.maximum(tf.shape(ids)[1] - 1, 0))
  token = tf.gather(tf.pad(ids, [[0, 0], [0, 1]]), column, axis=1)
  is_token = tf.range(tf.shape(logits)[-1]) == token[:, tf.newaxis]
  forced = bans_lib.move_to_pad(logits, ~is_token)
  return tf.where(forcing[:, tf.newaxis], forced, logits)
