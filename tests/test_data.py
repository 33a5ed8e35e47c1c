"""Data: the numbers task, the SentencePiece vocabulary in the graph, and
token-budget batches (nothing lost, nothing over budget)."""

import collections

import numpy as np
import pytest
import tensorflow as tf

from tf_transformer import special_ids
from tf_transformer.data import batching
from tf_transformer.data import numbers
from tf_transformer.data import sources
from tf_transformer.data import vocabulary as vocabulary_lib

SIZES = {"train": 3000, "dev": 200, "test": 200}


@pytest.fixture(scope="module")
def corpus():
  return numbers.generate(SIZES, seed=7)


@pytest.fixture(scope="module")
def vocabulary(corpus):
  sentences = [side for pair in corpus["train"] for side in pair]
  return vocabulary_lib.Vocabulary(vocabulary_lib.train(sentences, 300))


def test_numbers_is_deterministic_and_splits_are_disjoint(corpus):
  assert numbers.generate(SIZES, seed=7) == corpus
  assert numbers.generate(SIZES, seed=8) != corpus
  assert {k: len(v) for k, v in corpus.items()} == SIZES
  train, dev, test = (set(corpus[s]) for s in ("train", "dev", "test"))
  # Distinct but for the lexicon's repeats: 3,000 pairs hold it twice
  # (the next test), so 100 of them repeat.
  assert len(train) == SIZES["train"] - numbers.LEXICON
  assert not train & dev and not train & test and not dev & test
  # Growing the training set leaves dev and test where they were.
  bigger = numbers.generate(dict(SIZES, train=4000), seed=7)
  assert bigger["dev"] == corpus["dev"] and bigger["test"] == corpus["test"]


def test_numbers_pairs_are_english_to_german(corpus):
  pairs = dict(corpus["train"] + corpus["dev"] + corpus["test"])
  german = set(pairs.values())
  english = set(pairs)
  assert all(" " not in g for g in german)  # German glues number words
  assert any(e.endswith("twenty-one") for e in english)
  # Digit counts 1 to 6 are all represented.
  assert any(" " not in e and "-" not in e for e in english)  # e.g. "seven"
  assert any("thousand" in e for e in english)


def test_numbers_lexicon_is_in_train_and_dev_test_compose(corpus):
  # Every number below 100 is a training pair; dev and test never hold one,
  # so they test composition, not words the model could not have seen.
  lexicon = {numbers.num2words(n) for n in range(numbers.LEXICON)}
  train = {source for source, _ in corpus["train"]}
  assert lexicon <= train
  # Each repeated alike, to fill about LEXICON_SHARE of train: once each,
  # a model learned that every number has a hundred or a thousand in it.
  for size, repeats in ((3000, 2), (20000, 10), (500, 1), (40, 0)):
    drawn = [s for s, _ in numbers.generate({"train": size}, seed=7)["train"]]
    counts = collections.Counter(s for s in drawn if s in lexicon)
    assert len(drawn) == size
    if repeats:
      assert set(counts.values()) == {repeats} and len(counts) == 100, size
    else:  # a split smaller than the lexicon: each number at most once
      assert len(counts) == size and set(counts.values()) == {1}
  for split in ("dev", "test"):
    assert not lexicon & {source for source, _ in corpus[split]}
    assert any("thousand" not in s for s, _ in corpus[split])  # hundreds
  with pytest.raises(numbers.DataError, match="at most 1000000"):
    numbers.generate({"train": 1_100_000, "dev": 1000, "test": 1})
  source, target = numbers.generate({"train": 1}, seed=0,
                                    target_language="fr")["train"][0]
  assert source and target and source != target


def test_vocabulary_fixed_ids_and_round_trip(vocabulary, tmp_path):
  assert list(vocabulary.pieces(tf.constant([0, 1, 2, 3])).numpy()) == [
      b"<pad>", b"<unk>", b"<s>", b"</s>"]
  assert special_ids.PAD_ID == 0 and special_ids.EOS_ID == 3
  texts = ["four hundred and twenty-one", "vierhunderteinundzwanzig",
           "dreißig Grüße, naïve café", "日本語 ☃ never seen", ""]
  ids = vocabulary.tokenize(tf.constant(texts))
  assert not np.any(ids.flat_values.numpy() == special_ids.UNK_ID)
  assert [t.decode() for t in vocabulary.detokenize(ids).numpy()] == texts
  # Control ids decode to nothing, so padded decoder output detokenizes.
  padded = tf.concat([[special_ids.BOS_ID], ids[0], [special_ids.EOS_ID,
                                                      special_ids.PAD_ID]], 0)
  assert vocabulary.detokenize(padded).numpy().decode() == texts[0]
  path = vocabulary.save(str(tmp_path))
  loaded = vocabulary_lib.Vocabulary.load(str(tmp_path))
  assert path.endswith("vocabulary.model")
  assert loaded.vocab_size == vocabulary.vocab_size
  assert loaded.tokenize("zwei").numpy().tolist() == vocabulary.tokenize(
      "zwei").numpy().tolist()


def _token_pairs(corpus, vocabulary, split="train"):
  return batching.tokenize(
      tf.data.Dataset.from_tensor_slices(
          tuple(map(list, zip(*corpus[split])))), vocabulary)


def _strip(row):
  row = row.tolist()
  return tuple(row[:len(row) - row[::-1].index(next(
      x for x in row[::-1] if x != 0))]) if any(row) else ()


def _all_pairs(dataset):
  """(source, target) id tuples of a token-pair dataset."""
  return collections.Counter(
      (tuple(s.numpy().tolist()), tuple(t.numpy().tolist()))
      for s, t in dataset)


def _batched_pairs(batches, budget):
  """Checks every batch against the budget and returns the pairs it holds."""
  seen = collections.Counter()
  shapes = set()
  for (source, target_in), target_out in batches:
    assert source.shape.num_elements() <= budget
    assert target_in.shape.num_elements() <= budget
    assert target_in.shape == target_out.shape
    shapes.add(source.shape[1])
    for s, ti, to in zip(source.numpy(), target_in.numpy(),
                         target_out.numpy()):
      assert ti[0] == special_ids.BOS_ID
      target = _strip(to)
      assert target[-1] == special_ids.EOS_ID
      assert _strip(ti)[1:] == target[:-1]
      seen[(_strip(s), target[:-1])] += 1
  return seen, shapes


@pytest.mark.parametrize("budget, max_length", [(512, 16), (300, 24)])
def test_batches_respect_the_budget_and_keep_every_pair_once(
    corpus, vocabulary, budget, max_length):
  pairs = _token_pairs(corpus, vocabulary)
  expected = collections.Counter({
      pair: count for pair, count in _all_pairs(pairs).items()
      if max(len(pair[0]), len(pair[1]) + 1) <= max_length})
  stats = batching.length_statistics(pairs, max_length)
  assert stats["pairs"] - stats["dropped_too_long"] == sum(expected.values())
  assert stats["dropped_too_long"] > 0  # the filter is exercised
  seen, shapes = _batched_pairs(
      batching.token_batches(pairs, budget, max_length), budget)
  assert seen == expected
  assert shapes <= set(batching.bucket_lengths(max_length))
  assert all(length % 8 == 0 for length in shapes)


def test_bucket_lengths_are_few_multiples_of_eight():
  lengths = batching.bucket_lengths(256)
  assert lengths[-1] == 256 and len(lengths) <= 16
  assert all(b > a for a, b in zip(lengths, lengths[1:]))
  assert all(length % 8 == 0 for length in lengths)


def test_distributed_dataset_gives_each_replica_its_share(corpus, vocabulary):
  strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  pairs = lambda: _token_pairs(corpus, vocabulary, "dev")
  budget = 512
  dataset = strategy.distribute_datasets_from_function(
      batching.distributed_dataset_fn(pairs, budget, max_length=24))
  seen = collections.Counter()
  for batch in dataset:
    for replica_batch in (strategy.experimental_local_results(
        batch[0][0]), strategy.experimental_local_results(batch[1])):
      for tensor in replica_batch:
        assert tensor.shape.num_elements() <= budget // 2
    sources_, targets = (strategy.experimental_local_results(batch[0][0]),
                         strategy.experimental_local_results(batch[1]))
    for source, target_out in zip(sources_, targets):
      for s, t in zip(source.numpy(), target_out.numpy()):
        if any(s):
          seen[(_strip(s), _strip(t)[:-1])] += 1
  expected = collections.Counter({
      pair: count for pair, count in _all_pairs(pairs()).items()
      if max(len(pair[0]), len(pair[1]) + 1) <= 24})
  assert seen == expected


def test_text_pairs_of_a_spec(tmp_path):
  spec = sources.DataSpec(dataset="numbers", numbers_train_size=50)
  assert len(list(sources.text_pairs(spec, "train")())) == 50
  assert len(list(sources.text_pairs(spec, "dev")())) == 500


def test_vocabulary_size_follows_the_corpus(caplog):
  from tf_transformer.data import prepare  # pylint: disable=g-import-not-at-top
  assert [prepare.auto_vocab_size(n) for n in (500, 29_000, 200_000,
                                               4_500_000)] == [
                                                   4000, 8000, 16000, 37000]
  caplog.set_level("INFO")
  spec = sources.DataSpec(dataset="numbers", numbers_train_size=200)
  vocabulary = prepare.build_vocabulary(spec)
  assert "vocabulary size 4000 for 200 training pairs" in caplog.text
  # The numbers task cannot fill 4000 pieces, and the log says why.
  assert vocabulary.vocab_size < 4000
  assert (f"the vocabulary has {vocabulary.vocab_size} pieces, not 4000"
          in caplog.text)


def test_too_small_a_vocabulary_names_the_size_needed():
  from tf_transformer.data.errors import DataError  # pylint: disable=g-import-not-at-top
  with pytest.raises(DataError) as error:
    vocabulary_lib.train(["abcdefghij klmnop"] * 50, 100)
  message = str(error.value)
  assert message.startswith("--vocab_size=100 is too small for this corpus: "
                            "it needs at least 2")
  assert "character_coverage" not in message
