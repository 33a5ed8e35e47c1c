"""A search over a vocabulary shortlist (`data/shortlist_table.py`): each
request decodes over the target pieces its sources' table rows name, the
frequent pieces and its prefix's, not the whole vocabulary, as Marian's
`--shortlist` and CTranslate2's `use_vmap` do. The output projection
(section 3.4) then multiplies by those columns only.

    vocab = vocabulary(shortlist, source_ids, prefix)  # [S], sorted
    weights = restrict(weights, vocab)  # the step's, over the shortlist

The shortlist is sorted and always holds the special ids 0-3, which are the
smallest: so a search's own ids (positions in the shortlist) are the
special ids where those are, and the search runs unchanged; `tf.gather(
vocab, ids)` maps its outputs back. Scores are log-probabilities
normalized over the shortlist.
"""

import typing

import tensorflow as tf

from tf_transformer import special_ids
from tf_transformer.decoding import prefix as prefix_lib
from tf_transformer.decoding import step_weights as step_weights_lib

# Always in a shortlist: PAD, UNK, BOS, EOS (ids 0-3).
SPECIAL = tuple(range(max(special_ids.PAD_ID, special_ids.UNK_ID,
                          special_ids.BOS_ID, special_ids.EOS_ID) + 1))


class Shortlist(typing.NamedTuple):
  """`candidates` [vocab, K] int32 (-1 past a piece's last) and `frequent`
  [N] int32: `Table.cut`'s, as tensors or variables."""
  candidates: typing.Any
  frequent: typing.Any


def vocabulary(shortlist: Shortlist, source_ids, prefix=None):
  """The target pieces a batch decodes over.

  Args:
    shortlist: the `Shortlist`.
    source_ids: [batch, length] int32, the batch's sources.
    prefix: a `prefix.Prefix` whose pieces must be there too, or None.
  Returns:
    [S] int32, sorted, without repeats: the candidates of every source
    piece, the frequent pieces, the special ids 0-3 and the prefix's.
  """
  candidates = tf.convert_to_tensor(shortlist.candidates)
  size = candidates.shape[0]
  ids = [tf.reshape(tf.gather(candidates, source_ids), [-1]),
         tf.convert_to_tensor(shortlist.frequent), tf.constant(SPECIAL)]
  if prefix is not None:
    ids.append(tf.reshape(prefix.ids, [-1]))
  ids = tf.concat(ids, 0)
  ids = tf.boolean_mask(ids, ids >= 0)
  present = tf.scatter_nd(ids[:, tf.newaxis], tf.ones_like(ids), [size]) > 0
  return tf.cast(tf.where(present)[:, 0], tf.int32)


def with_output_rows(weights):
  """`weights` with the output projection kept as rows ([vocab, d_model],
  `StepWeights.output_rows`) in place of its columns, as an export over a
  shortlist stores it (every search there goes through `restrict`):
  `restrict` then gathers a request's pieces as contiguous rows and
  transposes them, where gathering columns of [d_model, vocab] copies one
  number at a time (several times slower: docs/performance.md).

  Args:
    weights: `StepWeights`, or a tuple of them (an ensemble's).
  Returns:
    `weights`' structure with `output_rows` set and `output_kernel` None.
  """
  if not isinstance(weights, step_weights_lib.StepWeights):
    return tuple(with_output_rows(w) for w in weights)
  return weights._replace(output_rows=tf.transpose(weights.output_kernel),
                          output_kernel=None)


def restrict(weights, vocab):
  """The step's weights over the shortlist `vocab`: target embedding rows
  and output projection columns of its pieces, in its order.

  Args:
    weights: `StepWeights`, or a tuple of them (an ensemble's).
    vocab: [S] int32 from `vocabulary`.
  Returns:
    `weights`' structure, each vocabulary axis cut to S (`output_rows`
    used for the projection where set, then dropped).
  """
  if not isinstance(weights, step_weights_lib.StepWeights):
    return tuple(restrict(w, vocab) for w in weights)
  if weights.output_rows is not None:
    output_kernel = tf.transpose(tf.gather(weights.output_rows, vocab))
  else:
    output_kernel = tf.gather(weights.output_kernel, vocab, axis=1)
  return weights._replace(
      embeddings=tf.gather(weights.embeddings, vocab),
      output_kernel=output_kernel,
      output_bias=tf.gather(weights.output_bias, vocab), output_rows=None)


def to_shortlist(prefix: prefix_lib.Prefix, vocab) -> prefix_lib.Prefix:
  """`prefix` in the search's ids (positions in `vocab`, which holds every
  prefix piece)."""
  where = tf.searchsorted(vocab[tf.newaxis], tf.reshape(prefix.ids, [1, -1]),
                          out_type=tf.int32)
  return prefix._replace(ids=tf.reshape(where, tf.shape(prefix.ids)))
