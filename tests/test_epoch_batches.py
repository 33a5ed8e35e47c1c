"""The training data path: a corpus tokenized once into token arrays
(`token_store`), and each epoch's batches drawn over the whole corpus
(`epoch_batches`): nothing lost or over budget, shuffled globally, seeded,
resumable at any batch, split between input pipelines; stale or damaged
arrays refused."""

import collections
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from tf_transformer import special_ids
from tf_transformer.data import batching
from tf_transformer.data import epoch_batches
from tf_transformer.data import prepare
from tf_transformer.data import sources
from tf_transformer.data import token_store
from tf_transformer.data import vocabulary as vocabulary_lib
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
  from_store = prepare.store_statistics([(store, 1.0)], 16)
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
      training_stream_fn([(store, 1.0)], 512, 32, seed=0))
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
  [(opened, weight)] = token_store.open_training(directory, spec,
                                                 vocabulary())
  assert opened.num_pairs == 2 and weight == 1.0
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


def _two_corpora(tmp_path, weights):
  """Corpus A of "one ..." and corpus B of "two ..." sentences, all of one
  padded length, and the spec naming both with `weights`."""
  words = ["seven", "twelve", "forty", "nine", "hundred"]
  for name, first in (("a", "one"), ("b", "two")):
    lines = "".join(f"{first} {x} {y}\n" for x in words for y in words) * 8
    (tmp_path / f"{name}.en").write_text(lines)
    (tmp_path / f"{name}.de").write_text(lines)
  return DataSpec(dataset="", train_source=f"{tmp_path}/a.en,{tmp_path}/b.en",
                  train_target=f"{tmp_path}/a.de,{tmp_path}/b.de",
                  train_weights=weights)


def test_several_corpora_are_drawn_by_their_weights_and_resume(tmp_path):
  spec = _two_corpora(tmp_path, "3,1")
  stores = token_store.open_training(str(tmp_path), spec, vocabulary())
  assert [(s.num_pairs, w) for s, w in stores] == [(200, 3.0), (200, 1.0)]
  assert sorted(os.listdir(tmp_path))[:4] == [
      "a.de", "a.en", "b.de", "b.en"]
  assert token_store.exists(str(tmp_path), "train0")
  assert token_store.exists(str(tmp_path), "train1")
  batches = epoch_batches.training_batches(stores, 64, 32, seed=1)
  one = int(vocabulary().tokenize("one").numpy()[0])
  kinds = collections.Counter()
  for index in range(batches.per_pipeline):
    firsts = {s[0] for s, _ in _pairs_of(batches.batch(0, index))}
    assert len(firsts) == 1  # a batch comes from one corpus
    kinds["a" if firsts == {one} else "b"] += 1
  # The mixture's epoch holds as many batches as both corpora's epochs,
  # 3 of corpus a for 1 of b.
  total = sum(part.per_pipeline for part in batches.parts)
  assert batches.per_pipeline == sum(kinds.values()) == total
  assert abs(kinds["a"] - 3 * kinds["b"]) <= 2, kinds
  whole = _stream(batches, 0, 0, 3 * batches.per_pipeline)
  again = epoch_batches.training_batches(stores, 64, 32, seed=1)
  start = batches.per_pipeline + 5
  assert _stream(again, 1, 5, 9) == whole[start:start + 9]


@pytest.mark.parametrize("weights, message", [
    ("1", "--train_weights=1: expected 2 positive numbers"),
    ("1,0", "--train_weights=1,0: expected 2 positive numbers"),
    ("1,x", "--train_weights=1,x: expected 2 positive numbers")])
def test_bad_weights_are_refused(tmp_path, weights, message):
  with pytest.raises(DataError, match=message):
    _two_corpora(tmp_path, weights).check()


def test_several_corpora_train_with_one_vocabulary(tmp_path):
  from tf_transformer import get_config  # pylint: disable=g-import-not-at-top
  from tf_transformer.run.runner import Runner  # pylint: disable=g-import-not-at-top
  spec = _two_corpora(tmp_path, None)
  config = get_config("tiny", vocab_size=300, train_steps=2,
                      batch_tokens=256)
  result = Runner(str(tmp_path / "run")).train(
      config, spec, vocab_size=300, max_length=32, eval_every_steps=0,
      checkpoint_every_secs=0)
  assert result["step"] == 2
  stats = json.loads((tmp_path / "run" / "data_stats.json").read_text())
  assert stats["train"]["pairs"] == 400
  assert stats["train"]["corpora"] == [{"pairs": 200, "weight": 1.0}] * 2
  pieces = vocabulary_lib.Vocabulary.load(str(tmp_path / "run")).pieces(
      tf.constant([int(i) for i in vocabulary_lib.Vocabulary.load(
          str(tmp_path / "run")).tokenize("one two").numpy()]))
  assert [p.decode() for p in pieces.numpy()] == ["▁one", "▁two"]


def test_a_bad_line_stops_tokenizing_naming_it_and_leaves_nothing(tmp_path):
  (tmp_path / "train.en").write_bytes(b"one\n\xff two\n")
  (tmp_path / "train.de").write_text("eins\nzwei\n")
  spec = DataSpec(dataset="", train_source=str(tmp_path / "train.en"),
                  train_target=str(tmp_path / "train.de"))
  with pytest.raises(DataError, match=r"train\.en:2: invalid UTF-8"):
    token_store.write(str(tmp_path / "run"), "train", spec, vocabulary())
  assert os.listdir(tmp_path / "run") == []
