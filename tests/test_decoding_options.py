"""Greedy decoding and sampling behind `decode`: scores are the model's own
length-penalised log P, n-best lists are sorted, top-k 1 and a tiny nucleus
are greedy, draws lie in the nucleus, seeds reproduce, and bad options name
themselves."""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_transformer import build_model, get_config
from tf_transformer.decoding.beam_search import length_penalty
from tf_transformer.decoding.greedy import greedy_search
from tf_transformer.decoding.greedy import nucleus
from tf_transformer.decoding.search import DecodingOptions, decode
from tf_transformer.decoding.step import Step
from tf_transformer.special_ids import BOS_ID, EOS_ID, PAD_ID
import rounding
from search_reference import lines_apart

SOURCES = tf.constant([[5, 6, 7, 8, EOS_ID], [9, 10, EOS_ID, PAD_ID, PAD_ID]])
SAMPLE = DecodingOptions(method="sample", num_samples=5, temperature=2.0,
                         max_decode_length_offset=6, seed=7)

pytestmark = pytest.mark.numeric


@pytest.fixture(scope="module")
def model():
  keras.utils.set_random_seed(99)
  return build_model(get_config("tiny", "vocab_size=40,dropout_rate=0.0"))


def _teacher_forced_scores(model, source, outputs, alpha):
  """log P(output | source) / lp(|output|) from one full decoder pass."""
  outputs = np.asarray(outputs)
  decoder_in = np.concatenate(
      [np.full((len(outputs), 1), BOS_ID), outputs[:, :-1]], 1)
  memory, mask = model.encode(tf.repeat(source[tf.newaxis], len(outputs), 0))
  logits = model.decode(tf.constant(decoder_in, tf.int32), memory, mask)
  log_probs = tf.nn.log_softmax(logits).numpy()
  token = np.take_along_axis(log_probs, outputs[..., None], -1)[..., 0]
  real = outputs != PAD_ID
  lengths = real.sum(1)
  return (token * real).sum(1) / length_penalty(lengths, alpha).numpy()


def test_greedy_option_is_greedy_search_with_penalised_scores(model):
  ids, scores = decode(model, SOURCES, DecodingOptions(
      method="greedy", max_decode_length_offset=6))
  greedy_ids, log_probs = greedy_search(model, SOURCES, 6)
  assert ids.shape[:2] == (2, 1)
  # Two loops (the search's, greedy_search's), of other shapes: the same
  # outputs but at near ties (tests/search_reference.py), the same scores
  # within both paths' float32 bounds (rounding.py).
  _same_greedy(model, ids, greedy_ids)
  lengths = tf.reduce_sum(tf.cast(greedy_ids != PAD_ID, tf.int32), 1)
  bound = 2 * rounding.search_bounds(model, _sources(), greedy_ids)[:, 0]
  rounding.assert_within(scores[:, 0],
                         log_probs / length_penalty(lengths, 0.6), bound)


def _sources():
  return rounding.unpadded(SOURCES)


def _same_greedy(model, ids, greedy_ids):
  """Asserts that each output of `ids` [rows, outputs, length] is the
  greedy output `greedy_ids` [rows, length] but where greedy decoding met a
  near tie (tests/search_reference.py)."""
  for column in range(ids.shape[1]):
    lines_apart(model, _sources(), np.asarray(ids)[:, column:column + 1],
                np.asarray(greedy_ids)[:, None], beam_size=1,
                max_length_offset=6)


def test_samples_are_scored_by_the_model_and_sorted(model):
  ids, scores = decode(model, SOURCES, SAMPLE)
  assert ids.shape[:2] == (2, 5) and scores.shape == (2, 5)
  for row in range(2):
    assert np.all(np.diff(scores[row]) <= 0), "n-best not sorted"
    expected = _teacher_forced_scores(model, SOURCES[row], ids[row], 0.6)
    # The cached step and teacher forcing: two paths, each within its
    # float32 bound (rounding.py).
    bound = 2 * rounding.search_bounds(model, _sources()[row:row + 1],
                                       ids[row:row + 1])[0]
    rounding.assert_within(scores[row], expected, bound)
    for sample in ids[row].numpy():
      ends = np.where(sample == EOS_ID)[0]
      if len(ends):  # nothing but padding after the end
        assert np.all(sample[ends[0] + 1:] == PAD_ID)


def test_seeds_reproduce_and_differ(model):
  first, _ = decode(model, SOURCES, SAMPLE)
  again, _ = decode(model, SOURCES, SAMPLE)
  np.testing.assert_array_equal(first, again)
  others = [decode(model, SOURCES, dataclasses.replace(SAMPLE, seed=s))[0]
            for s in range(8, 12)]
  # A near-uniform tiny model at temperature 2 over 40 tokens: four more
  # seeds all repeating the same 10 samples would be a broken seed.
  assert any(o.shape != first.shape or np.any(o.numpy() != first.numpy())
             for o in others)


def test_top_k_one_is_greedy_at_any_temperature(model):
  greedy_ids, _ = decode(model, SOURCES, DecodingOptions(
      method="greedy", max_decode_length_offset=6))
  ids, _ = decode(model, SOURCES, dataclasses.replace(
      SAMPLE, top_k=1, temperature=5.0))
  # The likeliest token alone, whatever the draw: greedy decoding, by the
  # sampling loop's batch of 5 rows a source (other shapes, other kernels).
  _same_greedy(model, ids, greedy_ids[:, 0])


def test_a_nucleus_below_the_likeliest_token_is_greedy(model):
  """top_p smaller than any probability keeps the likeliest token alone,
  at any temperature and after top-k."""
  greedy_ids, _ = decode(model, SOURCES, DecodingOptions(
      method="greedy", max_decode_length_offset=6))
  ids, _ = decode(model, SOURCES, dataclasses.replace(
      SAMPLE, top_k=10, top_p=1e-6, temperature=5.0))
  _same_greedy(model, ids, greedy_ids[:, 0])


def _nucleus_reference(logits, top_p):
  """The nucleus of each row, in numpy: its fewest most likely tokens whose
  probabilities sum to at least top_p."""
  kept = []
  for row in logits.astype(np.float64):
    probs = np.exp(row - row.max())
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")
    size = np.searchsorted(np.cumsum(probs[order]), top_p) + 1
    kept.append(set(order[:size].tolist()))
  return kept


@pytest.mark.parametrize("top_p", [0.05, 0.3, 0.7, 0.95, 0.999])
def test_nucleus_keeps_the_fewest_likeliest_tokens_reaching_top_p(top_p):
  logits = np.random.default_rng(3).normal(0, 2, (6, 40)).astype(np.float32)
  masked = nucleus(tf.constant(logits), top_p).numpy()
  expected = _nucleus_reference(logits, top_p)
  for row, kept in zip(masked, expected):
    assert set(np.flatnonzero(row > np.finfo(np.float32).min)) == kept
  np.testing.assert_array_equal(masked[masked > np.finfo(np.float32).min],
                                logits[masked > np.finfo(np.float32).min])


def test_every_draw_lies_in_the_nucleus_after_top_k(model):
  """The first token of 32 draws a sentence at temperature 2, top-k 10
  and top-p 0.5, against the nucleus computed apart from a teacher-forced
  first step (PAD and BOS never output): about half of the top 10, so
  draws that ignored the nucleus would leave it."""
  options = dataclasses.replace(SAMPLE, num_samples=32, top_k=10, top_p=0.5)
  ids, _ = decode(model, SOURCES, options)
  memory, mask = model.encode(SOURCES)
  logits = model.decode(tf.fill([2, 1], BOS_ID), memory, mask)[:, 0]
  logits = tf.nn.log_softmax(logits).numpy() / options.temperature
  logits[:, [PAD_ID, BOS_ID]] = -np.inf
  tenth = np.sort(logits, axis=-1)[:, -10:-9]
  logits = np.where(logits < tenth, -np.inf, logits)
  for row, kept in enumerate(_nucleus_reference(logits, options.top_p)):
    assert 1 < len(kept) < 10, kept
    assert set(ids[row, :, 0].numpy().tolist()) <= kept


def test_sampling_without_a_seed_runs_in_a_graph(model):
  search = tf.function(lambda ids: decode(model, ids, dataclasses.replace(
      SAMPLE, seed=None)))
  ids, scores = search(SOURCES)
  assert ids.shape[:2] == (2, 5)
  assert np.all(np.isfinite(scores.numpy()))


@pytest.mark.parametrize("field,value", [
    ("method", "nucleus"), ("beam_size", 0), ("length_penalty_alpha", -1.0),
    ("temperature", 0.0), ("top_k", -1), ("top_p", 0.0), ("top_p", 1.5),
    ("num_samples", 0),
    ("max_decode_length_offset", 0)])
def test_bad_options_name_the_field(field, value):
  with pytest.raises(ValueError, match=field):
    DecodingOptions(**{field: value})


def test_options_come_from_the_config():
  parsing = DecodingOptions.from_config(get_config("parsing"))
  assert (parsing.beam_size, parsing.length_penalty_alpha,
          parsing.max_decode_length_offset) == (21, 0.3, 300)
  base = DecodingOptions.from_config(get_config("base"), beam_size=None,
                                     method="greedy")
  assert (base.method, base.beam_size, base.length_penalty_alpha,
          base.nbest) == ("greedy", 4, 0.6, 1)
  # The options are the config's decoding part plus the method's choices.
  assert isinstance(base, type(get_config("base").decoding))


@pytest.mark.parametrize("method", ["beam", "greedy", "sample"])
def test_an_empty_batch_gives_empty_nbest_lists(model, method):
  options = DecodingOptions(method=method, num_samples=2)
  empty = tf.zeros([0, 5], tf.int32)
  for run in (decode, tf.function(decode, reduce_retracing=True)):
    ids, scores = run(model, empty, options)
    assert ids.shape[:2] == (0, options.nbest)
    assert scores.shape == (0, options.nbest)


# Greedy in the quick tier: the same stored weights feed every search.
@pytest.mark.parametrize("method", [
    pytest.param("beam", marks=pytest.mark.slow), "greedy",
    pytest.param("sample", marks=pytest.mark.slow)])
def test_stored_step_weights_decode_the_same(model, method):
  """The export keeps the decoding step's weights as variables (Q, K, V
  concatenated, the output embedding transposed) which a search reads once
  before its loop; without them it prepares them from the model: the same
  outputs, in graph mode and for split batches."""
  options = DecodingOptions(method=method, num_samples=2, seed=3,
                            max_decode_length_offset=6)
  stored = tf.nest.map_structure(
      lambda w: None if w is None else tf.Variable(w),
      Step(model).prepare(SOURCES.shape[1] + 8))
  assert stored.output_kernel.shape == (model.config.model.d_model,
                                        model.config.model.vocab_size)
  options = dataclasses.replace(options, parts=2)
  plain = tf.function(lambda s: decode(model, s, options))
  from_stored = tf.function(
      lambda s: decode(model, s, options, step_weights=stored))
  plain_ids, plain_scores = plain(SOURCES)
  ids, scores = from_stored(SOURCES)
  # Two graphs (variables read, or weights prepared and folded into the
  # graph): the same outputs but where a decision lies within their float32
  # rounding (tests/search_reference.py; for draws, those within it of a
  # boundary of the cumulative distribution, some 1e-5 of the mass, which
  # TensorFlow's sampler hides: a line in thousands), the same scores within
  # both paths' bounds (rounding.py).
  if method == "sample":
    same = np.all(ids.numpy() == plain_ids.numpy(), axis=(1, 2))
    assert same.sum() >= 1, same
  else:
    apart = lines_apart(model, _sources(), plain_ids.numpy(), ids.numpy(),
                        beam_size=options.nbest, max_length_offset=6)
    same = np.array([line not in apart for line in range(len(SOURCES))])
  bound = 2 * rounding.search_bounds(model, _sources(), plain_ids.numpy())
  rounding.assert_within(scores.numpy()[same], plain_scores.numpy()[same],
                         bound[same])
