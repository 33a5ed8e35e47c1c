"""A lexical shortlist of the target vocabulary, built from the training
pairs, as Marian's lexical shortlists and CTranslate2's vocabulary maps
(`vmap`): for each source piece the target pieces most associated with it,
and the most frequent target pieces. A search restricted to the pieces of
its request's sources (`decoding/shortlist.py`) multiplies by a fraction of
the output projection (section 3.4's pre-softmax transform).

Association is the Dice coefficient of sentence co-occurrence,

    dice(s, t) = 2 c(s, t) / (c(s) + c(t)),

c(s) the pairs whose source holds piece s, c(t) those whose target holds t,
c(s, t) those with both: symmetric, and unlike raw co-occurrence it does
not rank the commonest target pieces first for every source piece (those
come in through the frequent list). Ties go to the more frequent pair,
then to the lower id.

The table is `shortlist.npz` in the run directory: `candidates` int32
[vocab, K_max], each row best first, -1 past a piece's candidates;
`frequent` int32 [N_max], target pieces by token count, most frequent
first; and the vocabulary's SHA-256, so that a table of another vocabulary
is refused.
"""

import os
import typing

import numpy as np
from absl import logging

from tf_transformer.data import vocabulary as vocabulary_lib
from tf_transformer.data.errors import DataError

FILENAME = "shortlist.npz"
PAIRS_A_CHUNK = 20_000


class Table(typing.NamedTuple):
  """The table of a vocabulary (module docstring)."""
  candidates: np.ndarray  # int32 [vocab, K_max], -1 past the last
  frequent: np.ndarray  # int32 [N_max]
  vocabulary_sha256: str
  pairs: int  # training pairs it was counted on

  def cut(self, k, n):
    """(candidates [vocab, k], frequent [n]) int32, -1 entries as they
    are. Raises ValueError where the table holds fewer."""
    if k > self.candidates.shape[1] or n > len(self.frequent):
      raise ValueError(
          f"--shortlist={k},{n}: the table holds {self.candidates.shape[1]} "
          f"candidates a piece and {len(self.frequent)} frequent pieces; "
          "build it again with larger --k_max / --n_max")
    return self.candidates[:, :k], self.frequent[:n]


def _unique_per_pair(ids, offsets, vocab_size):
  """(pair index, piece) of each distinct piece of each pair, sorted by
  pair: `ids` the pairs' pieces end to end, `offsets` [pairs + 1]."""
  pair = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
  keys = np.unique(pair * vocab_size + ids.astype(np.int64))
  return keys // vocab_size, (keys % vocab_size).astype(np.int64)


def _cooccurrence(source, target, source_offsets, target_offsets, vocab_size):
  """(keys s * vocab + t, counts) of the pairs holding source piece s and
  target piece t, and (c(s), c(t)) [vocab] of one chunk of pairs."""
  source_pair, s = _unique_per_pair(source, source_offsets, vocab_size)
  target_pair, t = _unique_per_pair(target, target_offsets, vocab_size)
  pairs = len(source_offsets) - 1
  target_start = np.searchsorted(target_pair, np.arange(pairs))
  target_count = np.bincount(target_pair, minlength=pairs)
  # Each (pair, s) entry meets every t of its pair.
  repeats = target_count[source_pair]
  first = np.repeat(np.cumsum(repeats) - repeats, repeats)
  where = (np.arange(repeats.sum()) - first
           + np.repeat(target_start[source_pair], repeats))
  keys, counts = np.unique(np.repeat(s, repeats) * vocab_size + t[where],
                           return_counts=True)
  return (keys, counts, np.bincount(s, minlength=vocab_size),
          np.bincount(t, minlength=vocab_size))


def _merge(keys, counts):
  """Equal keys summed."""
  keys, inverse = np.unique(keys, return_inverse=True)
  return keys, np.bincount(inverse, weights=counts).astype(np.int64)


def build(stores, vocabulary, k_max=50, n_max=1000, max_pairs=1_000_000,
          progress=None) -> Table:
  """The table of training token stores (`data/token_store.py`).

  Args:
    stores: `TokenStore`s of the training corpora.
    vocabulary: their `Vocabulary`.
    k_max: candidates kept a source piece.
    n_max: frequent target pieces kept.
    max_pairs: pairs counted at most, spread evenly over the corpora.
    progress: a `progress.Progress`, told of the pairs counted.
  Returns:
    The `Table`.
  """
  vocab_size = vocabulary.vocab_size
  total = sum(store.num_pairs for store in stores)
  if not total:
    raise DataError("no training pairs to build a shortlist from")
  stride = max(1, -(-total // max_pairs))
  keys, counts = np.zeros([0], np.int64), np.zeros([0], np.int64)
  source_count = np.zeros([vocab_size], np.int64)
  target_count = np.zeros([vocab_size], np.int64)
  frequency = np.zeros([vocab_size], np.int64)
  counted = 0
  for store in stores:
    chosen = np.arange(0, store.num_pairs, stride)
    for start in range(0, len(chosen), PAIRS_A_CHUNK):
      rows = chosen[start:start + PAIRS_A_CHUNK]
      source, source_offsets = _gather(store.source, store.offsets[:, 0], rows)
      target, target_offsets = _gather(store.target, store.offsets[:, 1], rows)
      chunk = _cooccurrence(source, target, source_offsets, target_offsets,
                            vocab_size)
      keys, counts = _merge(np.concatenate([keys, chunk[0]]),
                            np.concatenate([counts, chunk[1]]))
      source_count += chunk[2]
      target_count += chunk[3]
      frequency += np.bincount(target, minlength=vocab_size)
      counted += len(rows)
      if progress:
        progress.add(len(rows))
  s, t = keys // vocab_size, keys % vocab_size
  dice = 2 * counts / (source_count[s] + target_count[t])
  order = np.lexsort((t, -counts, -dice, s))  # by s, then best first
  s, t = s[order], t[order]
  rank = np.arange(len(s)) - np.searchsorted(s, s)
  kept = rank < k_max
  candidates = np.full([vocab_size, k_max], -1, np.int32)
  candidates[s[kept], rank[kept]] = t[kept]
  frequent = np.argsort(-frequency, kind="stable")[:n_max]
  frequent = frequent[frequency[frequent] > 0].astype(np.int32)
  return Table(candidates, frequent, vocabulary_lib.sha256(vocabulary),
               counted)


def _gather(flat, starts, rows):
  """(the pieces of pairs `rows` end to end, their offsets [rows + 1])."""
  lengths = (starts[rows + 1] - starts[rows]).astype(np.int64)
  offsets = np.concatenate([[0], np.cumsum(lengths)])
  index = (np.arange(offsets[-1]) - np.repeat(offsets[:-1], lengths)
           + np.repeat(starts[rows].astype(np.int64), lengths))
  return np.asarray(flat)[index], offsets


def save(table: Table, model_dir) -> str:
  """Writes `table` as MODEL_DIR/shortlist.npz (atomically); its path."""
  path = os.path.join(model_dir, FILENAME)
  if os.path.exists(path + ".tmp"):
    logging.warning("replacing %s, left by a write that was stopped",
                    path + ".tmp")
  with open(path + ".tmp", "wb") as f:
    np.savez(f, candidates=table.candidates, frequent=table.frequent,
             vocabulary_sha256=table.vocabulary_sha256,
             pairs=np.int64(table.pairs))
  os.replace(path + ".tmp", path)
  return path


def load(model_dir, vocabulary) -> Table:
  """MODEL_DIR's table. Raises DataError naming the file where it is
  missing, damaged or of another vocabulary."""
  path = os.path.join(model_dir, FILENAME)
  build_it = f"build it with bin/build_shortlist.py --model_dir={model_dir}"
  if not os.path.exists(path):
    raise DataError(f"{path}: no shortlist table; {build_it}")
  try:
    with np.load(path) as arrays:
      table = Table(arrays["candidates"].astype(np.int32),
                    arrays["frequent"].astype(np.int32),
                    str(arrays["vocabulary_sha256"]), int(arrays["pairs"]))
  except (OSError, ValueError, KeyError) as e:
    raise DataError(f"{path}: cannot read ({e}); {build_it}") from None
  if (table.vocabulary_sha256 != vocabulary_lib.sha256(vocabulary)
      or table.candidates.shape[0] != vocabulary.vocab_size):
    raise DataError(f"{path}: made for another vocabulary than "
                    f"{model_dir}'s; {build_it}")
  return table


def vmap_lines(candidates, frequent, pieces):
  """CTranslate2's vocabulary map of a cut table: a line per source piece
  with candidates, `PIECE<TAB>TARGET TARGET ...`, and first the frequent
  pieces under the empty source, which CTranslate2 always includes.

  Args:
    candidates, frequent: `Table.cut`'s.
    pieces: the vocabulary's pieces in id order.
  Returns:
    The lines, without line breaks.
  """
  names = lambda ids: " ".join(pieces[i] for i in ids if i >= 0)
  lines = ["\t" + names(frequent)]
  for source, row in enumerate(candidates):
    if (row >= 0).any() and " " not in pieces[source]:
      lines.append(f"{pieces[source]}\t{names(row)}")
  return lines
