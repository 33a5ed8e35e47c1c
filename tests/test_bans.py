"""Tokens banned at a step (decoding/bans.py): min_length and
no_repeat_ngram_size, in every search, compiled or not, with a prefix, and
scores that stay the model's log P(Y|X)."""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_transformer import build_model, get_config
from tf_transformer.decoding import bans as bans_lib
from tf_transformer.decoding import prefix as prefix_lib
from tf_transformer.decoding import scoring
from tf_transformer.decoding.beam_search import length_penalty
from tf_transformer.decoding.search import DecodingOptions, decode
from tf_transformer.special_ids import EOS_ID, PAD_ID
import rounding
from search_reference import lines_apart

METHODS = ("greedy", "beam", "sample")

pytestmark = pytest.mark.numeric


def _reference_bans(history, step, size, vocab):
  """The tokens completing a repeated n-gram, as CTranslate2's NoRepeatNgram
  finds them, in Python."""
  banned = np.zeros((len(history), vocab), bool)
  for row, tokens in enumerate(history):
    outputs = list(tokens[1:step + 1])
    if len(outputs) < size - 1:
      continue
    suffix = outputs[len(outputs) - size + 1:]
    for start in range(len(outputs) - size + 1):
      if outputs[start:start + size - 1] == suffix:
        banned[row, outputs[start + size - 1]] = True
  return banned


@pytest.mark.parametrize("size", [2, 3, 4])
def test_repeated_ngram_tokens_equal_a_reference(size):
  rng = np.random.default_rng(size)
  found = 0
  for step in range(12):
    # Few distinct tokens: n-grams repeat often.
    history = rng.integers(4, 8, size=(6, 12)).astype(np.int32)
    got = bans_lib.repeated_ngram_tokens(tf.constant(history),
                                         tf.constant(step), size, 9).numpy()
    expected = _reference_bans(history, step, size, 9)
    np.testing.assert_array_equal(got, expected)
    found += expected.sum()
  assert found > 0


def test_moving_to_pad_keeps_the_normalization():
  logits = tf.constant(np.random.default_rng(0).normal(size=(3, 7)),
                       tf.float32)
  banned = tf.constant([[False, True, False, True, False, False, False],
                        [True] * 7,  # PAD's own column is ignored
                        [False] * 7])
  moved = bans_lib.move_to_pad(logits, banned).numpy()
  keep = ~banned.numpy()
  keep[:, PAD_ID] = False
  np.testing.assert_array_equal(moved[keep], logits.numpy()[keep])
  assert (moved[~keep & (np.arange(7) != PAD_ID)] <= -1e9).all()
  # Each row's softmax denominator is the model's, within float32 rounding:
  # a logsumexp of 7 terms is within (2 FUNCTION + 8) u of its magnitude (7
  # exponentials and their sum, within the sum, at least 1; its log; the
  # maximum added back), and the moved row holds one more (PAD's, a
  # logsumexp itself): three such errors at most between the two.
  want = tf.reduce_logsumexp(logits, -1).numpy()
  rounding.assert_within(tf.reduce_logsumexp(moved, -1), want, 3 * (
      2 * rounding.FUNCTION + 8) * rounding.U32 * np.maximum(np.abs(want), 1))
  np.testing.assert_array_equal(moved[2], logits.numpy()[2])


def test_settings_are_checked():
  for bad in ({"min_length": -1}, {"no_repeat_ngram_size": 1},
              {"no_repeat_ngram_size": -2}):
    with pytest.raises(ValueError, match=next(iter(bad))):
      DecodingOptions(**bad)


@pytest.fixture(scope="module")
def looping_model():
  """A random tiny model: some outputs end at once, others repeat tokens
  and bigrams up to their limit."""
  keras.utils.set_random_seed(1)
  model = build_model(get_config("tiny").replace(vocab_size=40))
  rng = np.random.default_rng(0)
  source = np.concatenate([rng.integers(4, 40, size=(6, 7)),
                           np.full((6, 1), EOS_ID)], 1).astype(np.int32)
  return model, tf.constant(source)


def _rows(ids):
  """Each output's tokens before EOS (the n-best flattened)."""
  rows = []
  for row in ids.numpy().reshape(-1, ids.shape[-1]):
    tokens = [int(t) for t in row if t != PAD_ID]
    rows.append(tokens[:tokens.index(EOS_ID)] if EOS_ID in tokens
                else tokens)
  return rows


def _repeats_a_bigram(tokens):
  bigrams = list(zip(tokens, tokens[1:]))
  return len(bigrams) != len(set(bigrams))


def _options(method, **kwargs):
  return DecodingOptions(method=method, seed=1, num_samples=2,
                         max_decode_length_offset=12, **kwargs)


@pytest.mark.parametrize("method", METHODS)
def test_no_output_repeats_an_ngram(looping_model, method):
  model, source = looping_model
  plain, _ = decode(model, source, _options(method))
  assert any(_repeats_a_bigram(t) for t in _rows(plain))  # else no test
  banned, _ = decode(model, source, _options(method, no_repeat_ngram_size=2))
  assert not any(_repeats_a_bigram(t) for t in _rows(banned))


@pytest.mark.parametrize("method", METHODS)
def test_outputs_reach_the_min_length(looping_model, method):
  model, source = looping_model
  plain, _ = decode(model, source, _options(method))
  assert min(len(t) for t in _rows(plain)) < 5  # else no test
  ids, _ = decode(model, source, _options(method, min_length=5))
  # The limit (8 source tokens + 12) is beyond it: every output reaches it.
  assert min(len(t) for t in _rows(ids)) >= 5


@pytest.mark.slow
@pytest.mark.parametrize("method", ["greedy", "beam"])
def test_compiled_search_bans_alike(looping_model, method):
  model, source = looping_model
  options = _options(method, min_length=4, no_repeat_ngram_size=2)
  ids, scores = decode(model, source, options)
  xla_ids, xla_scores = decode(model, source,
                               dataclasses.replace(options, xla=True))
  # Two paths (XLA's kernels, TensorFlow's): the same outputs but at near
  # ties of the banned search (tests/search_reference.py), the same scores
  # within their float32 bounds (rounding.py).
  sources = rounding.unpadded(source)
  apart = lines_apart(
      model, sources, ids.numpy(), xla_ids.numpy()[:, :, :ids.shape[-1]],
      beam_size=options.nbest, alpha=options.length_penalty_alpha,
      max_length_offset=options.max_decode_length_offset,
      bans=(options.min_length, options.no_repeat_ngram_size))
  same = np.array([line not in apart for line in range(len(sources))])
  bound = 2 * rounding.search_bounds(model, sources, ids.numpy())
  rounding.assert_within(scores.numpy()[same], xla_scores.numpy()[same],
                         bound[same])


@pytest.mark.parametrize("method", ["greedy", "beam"])
def test_scores_stay_the_models_log_probabilities(looping_model, method):
  """A banned token's probability is not spread over the others: a search's
  score is its output's teacher-forced log P(Y|X) / lp(Y)."""
  model, source = looping_model
  options = _options(method, min_length=6, no_repeat_ngram_size=2)
  ids, scores = decode(model, source, options)
  best = ids.numpy()[:, 0]
  lengths = (best != PAD_ID).sum(1)
  labels = tf.RaggedTensor.from_tensor(best, lengths=lengths)
  log_probs = scoring.token_log_probs(model, source, labels).numpy().sum(1)
  penalty = length_penalty(lengths, options.length_penalty_alpha).numpy()
  # Two paths (the cached step, teacher forcing), each within its float32
  # bound (rounding.py).
  bound = 2 * rounding.search_bounds(model, rounding.unpadded(source),
                                     best)[:, 0]
  rounding.assert_within(scores.numpy()[:, 0], log_probs / penalty, bound)


@pytest.mark.parametrize("method", METHODS)
def test_a_prefix_is_kept_and_min_length_counts_after_it(looping_model,
                                                         method):
  """A prefix that repeats a bigram is still forced; bans start after it,
  and min_length counts the tokens after it (CTranslate2's rule)."""
  model, source = looping_model
  forced = [5, 6, 5, 6]
  prefix = prefix_lib.from_ragged(tf.ragged.constant([forced] * 6))
  ids, _ = decode(model, source, _options(
      method, min_length=3, no_repeat_ngram_size=2), prefix=prefix)
  for tokens in _rows(ids):
    assert tokens[:4] == forced
    assert len(tokens) >= 4 + 3
    assert not _repeats_a_bigram(tokens[3:])
