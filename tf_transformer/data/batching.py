"""Token-budget batches of length-bucketed sentence pairs (section 5.1),
read from text in one ordered pass: the dev set and evaluation. Training
draws its batches over the whole corpus from token arrays
(`epoch_batches`), with the same bucket lengths.

"Sentence pairs were batched together by approximate sequence length. Each
training batch contained a set of sentence pairs containing approximately
25000 source tokens and 25000 target tokens." Here a batch holds at most
`batch_tokens` source tokens and at most `batch_tokens` target tokens,
padding included. Lengths are padded up to a few bucket lengths, multiples of
8, so XLA compiles one program per bucket. Pairs longer than `max_length`
are dropped (and counted by `length_statistics`), never truncated.

Batches are `((source_ids, target_input_ids), target_output_ids)`: the source
ends with EOS, the decoder input is BOS + target, the labels are target + EOS.
"""

import math
from typing import Callable, List, Sequence

import numpy as np
import tensorflow as tf

from tf_transformer import special_ids
from tf_transformer.data import pipeline_options
from tf_transformer.data import sequences
from tf_transformer.data.errors import DataError

STRING_PAIR = (tf.TensorSpec([], tf.string), tf.TensorSpec([], tf.string))


def text_dataset(pairs: Callable) -> tf.data.Dataset:
  """A dataset of (source, target) strings from a function returning an
  iterable of pairs (called again for each pass over the data)."""
  return tf.data.Dataset.from_generator(pairs, output_signature=STRING_PAIR)


def tokenize(text_pairs: tf.data.Dataset, vocabulary, chunk: int = 1024,
             source_eos: bool = True) -> tf.data.Dataset:
  """(source, target) strings -> (source ids + EOS (none unless
  `source_eos`), target ids), in graph (`sequences`)."""
  def encode(source, target):
    return (sequences.source_ids(vocabulary, source, eos=source_eos),
            sequences.subwords(sequences.target_side(vocabulary), target))
  return (text_pairs.batch(chunk)
          .map(encode, num_parallel_calls=tf.data.AUTOTUNE).unbatch())


def bucket_lengths(max_length: int, multiple: int = 8,
                   growth: float = 1.2) -> List[int]:
  """Padded lengths: multiples of `multiple` growing by about `growth`, the
  last being `max_length` rounded up to a multiple. 256 gives 14 shapes:
  8, 16, 24, 32, 40, 48, 64, 80, 96, 120, 144, 176, 216, 256."""
  round_up = lambda n: int(math.ceil(n / multiple)) * multiple
  lengths, length = [], multiple
  while length < max_length:
    lengths.append(length)
    length = max(length + multiple, round_up(length * growth))
  return lengths + [round_up(max_length)]


def pair_length(source_ids, target_ids):
  """The padded length a pair needs: source + EOS or BOS + target."""
  return tf.maximum(tf.shape(source_ids)[0], tf.shape(target_ids)[0] + 1)


def check_budget(batch_tokens: int, max_length: int):
  """Raises DataError unless a batch can hold the longest pair kept."""
  if batch_tokens < max_length:
    raise DataError(f"--batch_tokens={batch_tokens} cannot hold one sentence "
                    f"of --max_length={max_length}; raise --batch_tokens or "
                    "lower --max_length")


def token_batches(token_pairs: tf.data.Dataset, batch_tokens: int,
                  max_length: int) -> tf.data.Dataset:
  """Length-bucketed batches of at most `batch_tokens` tokens per side, in
  the order the pairs come (one pass, as the dev set is read)."""
  check_budget(batch_tokens, max_length)
  lengths = bucket_lengths(max_length)
  fits = lambda s, t: pair_length(s, t) <= max_length
  dataset = token_pairs.filter(fits)

  def split(source, target):
    labels = sequences.labels(target)
    return source, sequences.decoder_input(labels), labels

  dataset = dataset.map(split, num_parallel_calls=tf.data.AUTOTUNE)
  dataset = dataset.bucket_by_sequence_length(
      element_length_func=lambda source, target_in, _: pair_length(
          source, target_in[1:]),
      bucket_boundaries=[length + 1 for length in lengths],
      bucket_batch_sizes=[batch_tokens // length for length in lengths] + [1],
      padded_shapes=([None], [None], [None]),
      padding_values=(special_ids.PAD_ID,) * 3,
      pad_to_bucket_boundary=True)
  return pipeline_options.without_autotuning(
      dataset.map(lambda s, ti, to: ((s, ti), to)).prefetch(
          tf.data.AUTOTUNE))


def distributed_dataset_fn(token_pairs: Callable[[], tf.data.Dataset],
                           batch_tokens: int, max_length: int):
  """For `strategy.distribute_datasets_from_function` (one pass, in
  order): each input pipeline reads its own shard, and each replica's
  batches hold `batch_tokens / num_replicas` tokens, so a global step sees
  about `batch_tokens` tokens per side."""
  def dataset_fn(input_context: tf.distribute.InputContext):
    per_replica = batch_tokens // input_context.num_replicas_in_sync
    pairs = token_pairs().shard(input_context.num_input_pipelines,
                                input_context.input_pipeline_id)
    return token_batches(pairs, per_replica, max_length)
  return dataset_fn


def length_statistics(token_pairs: tf.data.Dataset, max_length: int,
                      progress=None,
                      percentiles: Sequence[int] = (50, 90, 95, 99, 100)):
  """Pairs, tokens, length percentiles, and pairs over `max_length`;
  `progress` (a `progress.Progress`) is told of each 4,096 pairs read."""
  source, target = [], []
  lengths = token_pairs.map(lambda s, t: (tf.shape(s)[0],
                                         tf.shape(t)[0])).batch(4096)
  for s, t in pipeline_options.without_autotuning(lengths):
    source.append(s.numpy())
    target.append(t.numpy())
    if progress:
      progress.add(len(source[-1]))
  source = np.concatenate(source) if source else np.zeros([0], np.int32)
  target = np.concatenate(target) if target else np.zeros([0], np.int32)
  return lengths_statistics(source, target, max_length, percentiles)


def lengths_statistics(source, target, max_length,
                       percentiles: Sequence[int] = (50, 90, 95, 99, 100)):
  """`length_statistics` of the pairs' lengths: `source` with its EOS,
  `target` without (as `tokenize` gives them)."""
  needed = np.maximum(source, target + 1)
  stats = {"pairs": int(source.size),
           "source_tokens": int(source.sum()),
           "target_tokens": int(target.sum()),
           "dropped_too_long": int((needed > max_length).sum()),
           "max_length": max_length}
  for name, lengths in (("source", source), ("target", target)):
    if lengths.size:
      stats[f"{name}_length_percentiles"] = {
          p: int(np.percentile(lengths, p)) for p in percentiles}
  return stats
