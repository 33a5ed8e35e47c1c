"""The training data path: a corpus tokenized once into token arrays
(`token_store`), and each epoch's batches drawn over the whole corpus
(`epoch_batches`): nothing lost or over budget, shuffled globally, seeded,
resumable at any batch, split between input pipelines; stale or damaged
arrays refused."""

import collections
import os

import numpy as np
import pytest
import tensorflow as tf

from tf_transformer import special_ids
from tf_transformer.data import batching
from tf_transformer.data import prepare
from tf_transformer.data import sources
from tf_transformer.data import token_store
from tf_transformer.data.epoch_batches import EpochBatches
from tf_transformer.data.epoch_batches import training_stream_fn
from tf_transformer.data.errors import DataError
from tf_transformer.data.sources import DataSpec
from training_helpers import SPEC, vocabulary


def _write_corpus(directory, pairs):
  source, target = directory / "train.en", directory / "train.de"
  source.write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
  target.write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
  return DataSpec(dataset="", train_source=str(source),
                  train_target=str(target))


@pytest.fixture(scope="module")
def store(tmp_path_factory):
  return token_store.write(str(tmp_path_factory.mktemp("store")), "train",
                           SPEC, vocabulary())


def _strip(row):
  return [int(i) for i in row if i != special_ids.PAD_ID]


def _pairs_of(batch):
  """(source ids, target ids) of each row of a batch, BOS/EOS removed."""
  source, target_in, target_out = batch
  pairs = []
  for s, ti, to in zip(source, target_in, target_out):
    s, ti, to = _strip(s), _strip(ti), _strip(to)
    assert s[-1] == special_ids.EOS_ID and to[-1] == special_ids.EOS_ID
    assert ti == [special_ids.BOS_ID] + to[:-1]
    pairs.append((tuple(s[:-1]), tuple(to[:-1])))
  return pairs


def test_the_arrays_hold_what_the_graph_tokenizer_gives(store):
  text = list(sources.text_pairs(SPEC, "train")())
  assert store.num_pairs == len(text) == 300
  assert store.source.dtype == np.uint16  # 2 bytes a token
  for i in (0, 17, 299):
    source, target = store.pair(i)
    assert source.tolist() == vocabulary().tokenize(text[i][0]).numpy(
        ).tolist()
    assert target.tolist() == vocabulary().tokenize(text[i][1]).numpy(
        ).tolist()


def test_statistics_from_the_arrays_equal_those_from_the_text(store):
  tokens = batching.tokenize(batching.text_dataset(
      sources.text_pairs(SPEC, "train")), vocabulary())
  from_text = batching.length_statistics(tokens, 16)
  from_store = prepare.store_statistics(store, 16)
  assert from_store.pop("dropped_empty_side") == 0
  assert from_store == from_text
  assert from_text["dropped_too_long"] > 0


@pytest.mark.parametrize("budget, max_length", [(512, 16), (300, 24)])
def test_an_epoch_holds_every_kept_pair_once_within_budget(
    store, budget, max_length):
  batches = EpochBatches(store, budget, max_length, seed=3)
  expected = collections.Counter()
  for i in range(store.num_pairs):
    source, target = store.pair(i)
    if max(len(source), len(target)) + 1 <= max_length:
      expected[(tuple(source.tolist()), tuple(target.tolist()))] += 1
  seen, widths = collections.Counter(), set()
  for index in range(batches.num_batches):
    batch = batches.batch(0, index)
    assert batch[0].size <= budget and batch[2].size <= budget
    widths.add(batch[0].shape[1])
    seen.update(_pairs_of(batch))
  assert seen == expected
  assert widths <= set(batching.bucket_lengths(max_length))


def test_the_first_batches_mix_both_halves_of_the_corpus(tmp_path):
  """A shuffle window smaller than the corpus would serve the first half's
  kind of sentence for the first half of the epoch."""
  words = ["seven", "twelve", "forty", "nine", "hundred"]
  first = [f"one {a} {b}" for a in words for b in words] * 16  # 400 each
  second = [f"two {a} {b}" for a in words for b in words] * 16
  spec = _write_corpus(tmp_path, [(t, t) for t in first + second])
  store = token_store.write(str(tmp_path), "train", spec, vocabulary())
  batches = EpochBatches(store, 256, 32, seed=0)
  assert batches.batch(0, 0)[0].shape == (32, 8)  # one length: one group
  kind = {int(vocabulary().tokenize(w).numpy()[0]): w for w in ("one", "two")}
  for index in range(3):
    kinds = {kind[s[0]] for s, _ in _pairs_of(batches.batch(0, index))}
    assert kinds == {"one", "two"}, index


def test_epochs_are_seeded_and_differ(store):
  plan = lambda seed, epoch: EpochBatches(store, 512, 32, seed).plan(epoch)
  same = [np.array_equal(a, b) for a, b in zip(plan(1, 0), plan(1, 0))]
  assert all(same)
  assert not np.array_equal(plan(1, 0)[0], plan(1, 1)[0])
  assert not np.array_equal(plan(1, 0)[0], plan(2, 0)[0])


def _stream(batches, start_epoch, start_batch, n):
  out = []
  for ((source, _), _), (epoch, index) in batches.dataset(
      start_epoch, start_batch).take(n):
    out.append((int(epoch), int(index), source.numpy().tolist()))
  return out


def test_a_stream_started_mid_epoch_continues_the_uninterrupted_one(store):
  batches = EpochBatches(store, 512, 32, seed=5)
  per_epoch = batches.num_batches
  whole = _stream(batches, 0, 0, 2 * per_epoch + 2)
  assert [e for e, _, _ in whole].count(0) == per_epoch
  start = per_epoch - 2  # crosses into epoch 1
  assert _stream(EpochBatches(store, 512, 32, seed=5), 0, start,
                 6) == whole[start:start + 6]
  assert _stream(EpochBatches(store, 512, 32, seed=5), 1, 3,
                 2) == whole[per_epoch + 3:per_epoch + 5]


def test_input_pipelines_split_each_epoch_between_them(store):
  whole = EpochBatches(store, 512, 32, seed=2)
  parts = [EpochBatches(store, 512, 32, seed=2, num_pipelines=2,
                        pipeline=p) for p in (0, 1)]
  assert sum(p.per_pipeline for p in parts) == whole.num_batches
  got = {}
  for p, part in enumerate(parts):
    for index in range(part.per_pipeline):
      got[index * 2 + p] = part.batch(0, index)[0].tolist()
  assert got == {b: whole.batch(0, b)[0].tolist()
                 for b in range(whole.num_batches)}


def test_replicas_share_the_budget_under_mirrored_strategy(store):
  strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  dataset = strategy.distribute_datasets_from_function(
      training_stream_fn(store, 512, 32, seed=0))
  batch, _ = next(iter(dataset))
  for source in strategy.experimental_local_results(batch[0][0]):
    assert 0 < source.shape.num_elements() <= 256


def test_a_budget_below_one_sentence_is_refused(store):
  with pytest.raises(DataError, match="--batch_tokens=16 cannot hold one "
                     "sentence of --max_length=64"):
    EpochBatches(store, 16, 64)


def test_changed_files_another_vocabulary_and_damage_are_refused(tmp_path):
  spec = _write_corpus(tmp_path, [("one two", "eins zwei"), ("three", "drei")])
  directory = str(tmp_path / "run")
  token_store.write(directory, "train", spec, vocabulary())
  assert token_store.open_or_write(directory, "train", spec,
                                   vocabulary()).num_pairs == 2
  other = prepare.build_vocabulary(DataSpec(dataset="numbers",
                                            numbers_train_size=100), 300)
  with pytest.raises(DataError, match="stale: tokenized with another "
                     "vocabulary"):
    token_store.open_store(directory, "train", spec, other)
  with open(spec.train_target, "a", encoding="utf-8") as f:
    f.write("")
  os.utime(spec.train_target, ns=(1, 1))
  with pytest.raises(DataError, match=f"{spec.train_target} changed since it "
                     "was tokenized"):
    token_store.open_store(directory, "train", spec, vocabulary())
  token_store.write(directory, "train", spec, vocabulary())
  path = os.path.join(directory, "train.target.npy")
  with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) - 2)
  with pytest.raises(DataError, match=f"{path}: missing or damaged"):
    token_store.open_store(directory, "train", spec, vocabulary())
  os.remove(path)
  with pytest.raises(DataError, match=f"{path}: missing or damaged"):
    token_store.open_store(directory, "train", spec, vocabulary())
