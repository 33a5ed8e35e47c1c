"""Training batches drawn over the whole corpus, resumable by position.

Section 5.1's batches ("sentence pairs were batched together by
approximate sequence length", about `batch_tokens` source and target tokens
each), made from a `token_store` as fairseq makes them: each epoch permutes
every pair of the corpus, seeded by (seed, epoch); groups the permuted pairs
by padded length (`batching.bucket_lengths`, multiples of 8, so XLA compiles
one program per length); cuts each group into batches of at most
`batch_tokens` tokens a side, padding included; and permutes the batches.
Pairs longer than `max_length` are left out, never cut. With `full_rows`
(the trainer's `--xla_attention`), a group's last batch is filled up with
empty rows, so that every batch of a length has one shape.

An epoch's plan is a function of (seed, epoch) alone, so the stream can
start at any (epoch, batch): a resumed run trains on exactly the batches
an uninterrupted one would have, without reading the batches before. Input
pipeline p of P (one per worker under MultiWorkerMirroredStrategy) takes
batches p, p + P, ... of each epoch and reads only their pairs.

Several corpora (`WeightedBatches`): each batch is drawn from one corpus
by the corpora's weights, in an order that is a function of (seed, epoch)
too.

State: the kept pairs' indices and length groups (5 bytes a pair) and one
epoch's plan (4 to 8 bytes a pair); the token ids stay memory-mapped.
"""

import math
import threading

from absl import logging
import numpy as np
import tensorflow as tf

from tf_transformer.data import batching
from tf_transformer.data import pipeline_options
from tf_transformer.data.errors import DataError
from tf_transformer.special_ids import BOS_ID, EOS_ID


class EpochBatches:
  """The batches of each epoch of `store` for one input pipeline."""

  def __init__(self, store, batch_tokens, max_length, seed=0,
               num_pipelines=1, pipeline=0, source_eos=True, full_rows=False):
    batching.check_budget(batch_tokens, max_length)
    self.store, self.seed, self.source_eos = store, seed, source_eos
    self.full_rows = full_rows
    self.num_pipelines, self.pipeline = num_pipelines, pipeline
    self.lengths = np.array(batching.bucket_lengths(max_length))
    self.rows = np.maximum(batch_tokens // self.lengths, 1)
    source, target = store.lengths()
    needed = np.maximum(source + 1, target + 1)  # + EOS / BOS
    index_type = np.int32 if store.num_pairs < 2**31 else np.int64
    self.kept = np.flatnonzero(needed <= max_length).astype(index_type)
    self.group = np.searchsorted(self.lengths, needed[self.kept]).astype(
        np.int8)
    self.counts = np.bincount(self.group, minlength=len(self.lengths))
    self.num_batches = int(sum(math.ceil(c / r)
                               for c, r in zip(self.counts, self.rows)))
    self.per_pipeline = len(range(pipeline, self.num_batches, num_pipelines))
    if not self.per_pipeline:
      raise DataError(
          f"the training data make {self.num_batches} batches of "
          f"--batch_tokens={batch_tokens} an epoch, fewer than the "
          f"{num_pipelines} input pipelines; lower --batch_tokens or add "
          "data")
    self._plans = _RecentPlans(self._make_plan)

  def plan(self, epoch):
    """(order, starts, ends, groups): batch b of the epoch is the pairs
    `order[starts[b]:ends[b]]`, padded to `lengths[groups[b]]`."""
    return self._plans.get(epoch)

  def _make_plan(self, epoch):
    rng = np.random.default_rng([*np.atleast_1d(self.seed), epoch])
    shuffled = rng.permutation(len(self.kept))
    by_group = shuffled[np.argsort(self.group[shuffled], kind="stable")]
    order = self.kept[by_group]
    counts = self.counts
    group_starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    starts, groups = [], []
    for g, (first, count, rows) in enumerate(zip(group_starts, counts,
                                                 self.rows)):
      starts.append(np.arange(first, first + count, rows))
      groups.append(np.full(len(starts[-1]), g, np.int8))
    starts, groups = np.concatenate(starts), np.concatenate(groups)
    ends = np.minimum(starts + self.rows[groups],
                      group_starts[groups] + counts[groups])
    batches = rng.permutation(len(starts))
    return order, starts[batches], ends[batches], groups[batches]

  def batch_shapes(self):
    """The (rows, length) shapes this corpus' batches take."""
    shapes = set()
    for rows, length, count in zip(self.rows.tolist(), self.lengths.tolist(),
                                   self.counts.tolist()):
      if not count:
        continue
      if self.full_rows:
        shapes.add((rows, length))
        continue
      shapes.add((min(count, rows), length))  # full batches, or the one
      if count > rows and count % rows:  # the group's last, shorter batch
        shapes.add((count % rows, length))
    return shapes

  def batch(self, epoch, index):
    """This pipeline's batch `index` of `epoch`: (source + EOS (no EOS
    unless `source_eos`), BOS + target, target + EOS), int32 [rows,
    length], padded with PAD (0); with `full_rows`, the group's rows."""
    order, starts, ends, groups = self.plan(int(epoch))
    b = int(index) * self.num_pipelines + self.pipeline
    pairs = np.sort(order[starts[b]:ends[b]])  # reads in file order
    width = int(self.lengths[groups[b]])
    rows = int(self.rows[groups[b]]) if self.full_rows else len(pairs)
    store = self.store
    return (_padded(store.source, store.offsets[:, 0], pairs, width, rows,
                    last=EOS_ID if self.source_eos else None),
            _padded(store.target, store.offsets[:, 1], pairs, width, rows,
                    first=BOS_ID),
            _padded(store.target, store.offsets[:, 1], pairs, width, rows,
                    last=EOS_ID))

  def dataset(self, start_epoch=0, start_batch=0) -> tf.data.Dataset:
    return _stream(self, start_epoch, start_batch)


class WeightedBatches:
  """Batches of several corpora (`EpochBatches` each), each batch drawn
  from corpus k with odds `weights[k]`, as OpenNMT-tf's weighted datasets.

  An epoch of the mixture holds S_k batches of corpus k, S_k its weight's
  share of all corpora's batches (at least 1), in an order drawn by (seed,
  epoch); corpus k's batches run on through its own epochs, whatever the
  mixture's. Position (epoch, index) -> (corpus, its batch) is a function,
  so a resume needs no replay either.
  """

  def __init__(self, parts, weights, seed=0):
    self.parts, self.seed = parts, seed
    total = sum(p.per_pipeline for p in parts)
    self.shares = np.array([max(1, round(total * w / sum(weights)))
                            for w in weights])
    self.per_pipeline = int(self.shares.sum())
    self.num_batches = sum(p.num_batches for p in parts)
    self._plans = _RecentPlans(self._make_plan)

  def plan(self, epoch):
    """(corpus of each position, its running batch count in the epoch)."""
    return self._plans.get(epoch)

  def _make_plan(self, epoch):
    rng = np.random.default_rng([*np.atleast_1d(self.seed), epoch])
    corpus = rng.permutation(np.repeat(np.arange(len(self.parts)),
                                       self.shares))
    running = np.zeros(len(corpus), np.int64)
    for k in range(len(self.parts)):
      running[corpus == k] = np.arange(self.shares[k])
    return corpus, running

  def batch(self, epoch, index):
    corpus, running = self.plan(int(epoch))
    k = int(corpus[int(index)])
    j = int(epoch) * int(self.shares[k]) + int(running[int(index)])
    part = self.parts[k]
    return part.batch(j // part.per_pipeline, j % part.per_pipeline)

  def batch_shapes(self):
    """The (rows, length) shapes the corpora's batches take."""
    return set().union(*(part.batch_shapes() for part in self.parts))

  def dataset(self, start_epoch=0, start_batch=0) -> tf.data.Dataset:
    return _stream(self, start_epoch, start_batch)


class _RecentPlans:
  """The plans of the last two epochs asked for (the stream only moves
  forward; near an epoch's end, parallel reads ask for both), made once
  each by `make(epoch)` under a lock."""

  def __init__(self, make):
    self._make, self._plans, self._lock = make, {}, threading.Lock()

  def get(self, epoch):
    with self._lock:
      if epoch not in self._plans:
        if len(self._plans) >= 2:
          del self._plans[min(self._plans)]
        self._plans[epoch] = self._make(epoch)
      return self._plans[epoch]


def _stream(batches, start_epoch, start_batch) -> tf.data.Dataset:
  """Endless: `(((source, target_in), target_out), (epoch, index))` from
  `batches`' batch `start_batch` of `start_epoch` on."""
  per_epoch = batches.per_pipeline

  def load(position):
    epoch, index = position // per_epoch, position % per_epoch
    tensors = tf.numpy_function(batches.batch, [epoch, index],
                                [tf.int32] * 3, stateful=False)
    source, target_in, target_out = [tf.ensure_shape(t, [None, None])
                                     for t in tensors]
    return ((source, target_in), target_out), (epoch, index)

  start = start_epoch * per_epoch + start_batch
  return pipeline_options.without_autotuning(
      tf.data.Dataset.range(start, 2**62).map(
          load, num_parallel_calls=tf.data.AUTOTUNE,
          deterministic=True).prefetch(tf.data.AUTOTUNE))


def _padded(flat, offsets, pairs, width, rows, first=None, last=None):
  """Rows of `flat[offsets[p]:offsets[p + 1]]` for each pair p, after an
  optional `first` id and before an optional `last` one, padded with 0 to
  `width`, then with rows of 0 to `rows` (in one vectorized gather)."""
  begin = np.asarray(offsets[pairs])
  lengths = np.asarray(offsets[pairs + 1]) - begin
  shift = 0 if first is None else 1
  out = np.zeros([rows, width], np.int32)
  row_starts = np.cumsum(lengths) - lengths
  within = np.arange(int(lengths.sum())) - np.repeat(row_starts, lengths)
  rows = np.repeat(np.arange(len(pairs)), lengths)
  out[rows, within + shift] = flat[np.repeat(begin, lengths) + within]
  if first is not None:
    out[:len(pairs), 0] = first
  if last is not None:
    out[np.arange(len(pairs)), lengths + shift] = last
  return out


def training_batches(stores, batch_tokens, max_length, seed=0,
                     num_pipelines=1, pipeline=0, source_eos=True,
                     full_rows=False):
  """The batches of `stores` ([(TokenStore, weight)], `token_store.
  open_training`): `EpochBatches` for one corpus, `WeightedBatches` for
  several; sources end with EOS where `source_eos`; `full_rows` as
  `EpochBatches`'."""
  parts = [EpochBatches(store, batch_tokens, max_length,
                        seed if len(stores) == 1 else (seed, k),
                        num_pipelines, pipeline, source_eos, full_rows)
           for k, (store, _) in enumerate(stores)]
  if len(parts) == 1:
    return parts[0]
  return WeightedBatches(parts, [weight for _, weight in stores], seed)


def training_stream_fn(stores, batch_tokens, max_length, seed=0,
                       start_epoch=0, start_batch=0, source_eos=True,
                       full_rows=False):
  """For `strategy.distribute_datasets_from_function`: each input pipeline
  takes its share of every epoch's batches, of `batch_tokens /
  num_replicas` tokens a side, so a global step sees about `batch_tokens`
  tokens a side; the stream starts at (`start_epoch`, `start_batch`);
  sources end with EOS where `source_eos` (`ModelConfig.source_eos`); with
  `full_rows`, one shape a length (`EpochBatches`), logged."""
  def dataset_fn(input_context: tf.distribute.InputContext):
    batches = training_batches(
        stores, batch_tokens // input_context.num_replicas_in_sync,
        max_length, seed, input_context.num_input_pipelines,
        input_context.input_pipeline_id, source_eos, full_rows)
    if full_rows:
      shapes = sorted(batches.batch_shapes(), key=lambda s: s[1])
      logging.info(
          "XLA compiles the attention of the training step (--xla_attention):"
          " one program for each of the %d batch shapes of input pipeline %d "
          "(rows x length: %s), and one for its gradient", len(shapes),
          input_context.input_pipeline_id,
          ", ".join(f"{r}x{n}" for r, n in shapes))
    pairs = sum(store.num_pairs for store, _ in stores)
    kept = sum(len(p.kept) for p in getattr(batches, "parts", [batches]))
    logging.info("input pipeline %d of %d: %d of each epoch's %d batches "
                 "(%d of %d pairs kept, the rest over --max_length=%d), from "
                 "epoch %d batch %d", input_context.input_pipeline_id,
                 input_context.num_input_pipelines, batches.per_pipeline,
                 batches.num_batches, kept, pairs, max_length, start_epoch,
                 start_batch)
    return batches.dataset(start_epoch, start_batch)
  return dataset_fn
