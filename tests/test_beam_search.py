"""Beam search: beam 1 is greedy, a wide beam is exact, finished hypotheses
stop, batches decode like single sentences."""

import dataclasses
import functools
import itertools

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_transformer import build_model, get_config
from tf_transformer.data import numbers
from tf_transformer.data import sequences
from tf_transformer.decoding import beam_search
from tf_transformer.decoding.beam_search import length_penalty
from tf_transformer.decoding.greedy import greedy_search
from tf_transformer.decoding.search import DecodingOptions
from tf_transformer.decoding.search import decode
from tf_transformer.decoding import search
from tf_transformer.special_ids import BOS_ID, EOS_ID, PAD_ID
from tf_transformer.run import run_dir
import rounding
from search_reference import lines_apart
from training_helpers import beam_search as model_beam_search

pytestmark = pytest.mark.numeric

SOURCES = tf.constant([[5, 6, 7, 8, EOS_ID], [9, 10, EOS_ID, PAD_ID, PAD_ID],
                       [11, EOS_ID, PAD_ID, PAD_ID, PAD_ID]])


def _source_ids(vocabulary, texts):
  return sequences.source_ids(vocabulary, tf.constant(texts)).to_tensor()


@pytest.fixture(scope="module")
def model():
  # Module fixtures run before the per-test seeding: seed here, or every run
  # draws another model.
  keras.utils.set_random_seed(1234)
  return build_model(get_config("tiny", "vocab_size=40,dropout_rate=0.0"))


def _strip(row):
  row = list(row)
  while row and row[-1] == PAD_ID:
    row.pop()
  return row


def _sources():
  return [_strip(row) for row in SOURCES.numpy()]


def _within_where_same(model, sources, apart, scores, other_scores, ids):
  """Two searches' scores of the lines not `apart`: two paths, each within
  its float32 bound (rounding.py) of the outputs' exact scores."""
  same = np.array([line not in apart for line in range(len(sources))],
                  bool)
  if not same.any():
    return
  bound = 2 * rounding.search_bounds(model, [sources[line] for line in
                                             np.flatnonzero(same)],
                                     np.asarray(ids)[same])
  want = np.asarray(scores)[same]
  rounding.assert_within(np.asarray(other_scores)[same], want,
                         bound.reshape(want.shape))


def test_beam_one_without_penalty_is_greedy(model):
  greedy_ids, greedy_scores = greedy_search(model, SOURCES, 6)
  ids, scores = model_beam_search(model, SOURCES, beam_size=1, alpha=0.0,
                                  max_length_offset=6)
  # Two loops over the cached step, other shapes: the same outputs but at
  # near ties (tests/search_reference.py), the same scores within rounding.
  apart = lines_apart(model, _sources(), ids.numpy(),
                      greedy_ids.numpy()[:, None], beam_size=1, alpha=0.0,
                      max_length_offset=6)
  _within_where_same(model, _sources(), apart, scores[:, 0], greedy_scores,
                     ids[:, 0])


def _exhaustive_best(model, source, limit, alpha, vocab):
  """Every output of at most `limit` tokens, scored like the beam search."""
  memory, mask = model.encode(source[tf.newaxis])
  sequences = np.array(list(itertools.product(range(vocab), repeat=limit)))
  decoder_in = np.concatenate(
      [np.full((len(sequences), 1), BOS_ID), sequences[:, :-1]], 1)
  logits = model.decode(tf.constant(decoder_in, tf.int32),
                        tf.repeat(memory, len(sequences), 0),
                        tf.repeat(mask, len(sequences), 0))
  log_probs = tf.nn.log_softmax(logits).numpy()
  token_log_probs = np.take_along_axis(log_probs, sequences[..., None],
                                       -1)[..., 0]
  best = {}
  for seq, lp in zip(sequences, token_log_probs):
    if PAD_ID in seq or BOS_ID in seq:
      continue  # never outputs (special_ids.NEVER_OUTPUT)
    ends = np.where(seq == EOS_ID)[0]
    length = ends[0] + 1 if len(ends) else limit
    hypothesis = tuple(seq[:length])
    score = lp[:length].sum() / float(length_penalty(length, alpha))
    best[hypothesis] = score
  hypothesis = max(best, key=best.get)
  return list(hypothesis), best[hypothesis]


def test_wide_beam_finds_the_exhaustive_optimum():
  # Six tokens, outputs of at most 3 (a 2-token source + the smallest
  # offset, 1): 6^3 sequences to enumerate; with 64 beams (more than the 36
  # live prefixes of length 2) the search is exact.
  model = build_model(get_config("tiny", "vocab_size=6,dropout_rate=0.0"))
  for seed in range(3):
    source = tf.constant([4 + seed % 2, EOS_ID])
    expected, expected_score = _exhaustive_best(model, source, 3, 0.6, 6)
    ids, scores = model_beam_search(model, source[tf.newaxis], beam_size=64,
                                    alpha=0.6, max_length_offset=1)
    # Source of 2 tokens + offset 1 -> at most 3 output tokens.
    assert ids.shape[-1] == 3
    found = _strip(ids[0, 0].numpy())
    # The exhaustive optimum, unless another output scores within both
    # computations' float32 rounding of it (rounding.py).
    bound = rounding.output_bounds(model, [_strip(source.numpy())] * 2,
                                   [expected, found])
    assert found == expected or abs(float(scores[0, 0]) - expected_score) <= (
        2 * bound.sum()), (found, expected)
    rounding.assert_within(scores[0, 0], expected_score, 2 * bound.max())


def test_never_emits_pad_or_bos_even_when_they_score_best():
  vocab = 12
  # PAD is always the most likely token, BOS the next; then 5, then EOS.
  preference = np.zeros([vocab], np.float32)
  preference[[PAD_ID, BOS_ID, 5, EOS_ID]] = [10.0, 9.0, 3.0, 2.0]

  def symbols_to_logits(ids, step, cache):
    del step
    return tf.tile(preference[tf.newaxis], [tf.shape(ids)[0], 1]), cache
  ids, scores = beam_search.beam_search(
      symbols_to_logits, {}, 2, tf.constant([6, 6]), 6, beam_size=4,
      alpha=0.6, reorder_cache=lambda cache, parents: cache)
  for row in ids.numpy().reshape(-1, 6):
    kept = _strip(row)
    assert kept and PAD_ID not in kept and BOS_ID not in kept
  assert np.all(np.isfinite(scores.numpy())) and np.all(scores.numpy() > -1e3)


def test_every_hypothesis_scores_what_teacher_forcing_gives(model):
  """Each n-best entry's score is log P(Y|X) / lp(Y) of a teacher-forced
  pass over it (EOS included when it has one)."""
  ids, scores = model_beam_search(model, SOURCES, beam_size=4, alpha=0.6,
                                  max_length_offset=6)
  memory, mask = model.encode(SOURCES)
  for row in range(3):
    for beam in range(4):
      output = _strip(ids[row, beam].numpy())
      decoder_in = tf.constant([[BOS_ID] + output[:-1]], tf.int32)
      log_probs = tf.nn.log_softmax(model.decode(
          decoder_in, memory[row:row + 1], mask[row:row + 1]))[0].numpy()
      total = sum(log_probs[t, token] for t, token in enumerate(output))
      bound = rounding.output_bounds(model, [_sources()[row]], [output])
      rounding.assert_within(
          scores[row, beam], total / float(length_penalty(len(output), 0.6)),
          2 * bound)


def test_finished_hypotheses_stop_growing_and_are_sorted(model):
  ids, scores = model_beam_search(model, SOURCES, beam_size=4, alpha=0.6,
                                  max_length_offset=8)
  for row in ids.numpy():
    for beam in row:
      ends = np.where(beam == EOS_ID)[0]
      if len(ends):
        assert np.all(beam[ends[0] + 1:] == PAD_ID)
  scores = scores.numpy()
  assert np.all(np.diff(scores, axis=1) <= 0)  # sorted by these very numbers
  lengths = (ids.numpy() != PAD_ID).sum(-1)
  limits = (SOURCES.numpy() != PAD_ID).sum(-1) + 8
  assert np.all(lengths <= limits[:, None])


def test_batch_decodes_like_single_sentences(model):
  ids, scores = model_beam_search(model, SOURCES, beam_size=3,
                                  max_length_offset=5)
  sources = _sources()
  for row in range(3):
    length = int((SOURCES[row] != PAD_ID).numpy().sum())
    one_ids, one_scores = model_beam_search(
        model, SOURCES[row:row + 1, :length], beam_size=3, max_length_offset=5)
    # Other shapes, other kernels: the same n-best but at near ties.
    apart = lines_apart(model, sources[row:row + 1], ids.numpy()[row:row + 1],
                        one_ids.numpy(), beam_size=3, max_length_offset=5)
    _within_where_same(model, sources[row:row + 1], apart, scores[row:row + 1],
                       one_scores, ids[row:row + 1])


@pytest.mark.slow
def test_fixed_length_search_compiles_once_with_xla(model):
  options = DecodingOptions(beam_size=4, max_decode_length_offset=4)
  search_fn = tf.function(
      lambda source: search._search(model, source, options, max_length=12),  # pylint: disable=protected-access
      jit_compile=True)
  eager_ids, eager_scores = model_beam_search(model, SOURCES, beam_size=4,
                                              max_length_offset=4)
  ids, scores = search_fn(SOURCES)
  search_fn(SOURCES + 1)
  assert search_fn.experimental_get_tracing_count() == 1
  apart = lines_apart(model, _sources(), eager_ids.numpy()[:, :1],
                      ids.numpy()[:, :1], max_length_offset=4)
  _within_where_same(model, _sources(), apart, eager_scores[:, 0],
                     scores[:, 0], eager_ids[:, 0])


@pytest.mark.parametrize("columns", [3000, 3008, 40])
def test_top_k_is_tf_top_k(columns):
  x = tf.random.stateless_normal([6, columns], seed=[1, columns])
  values, ids = beam_search.top_k(x, 8)
  expected_values, expected_ids = tf.math.top_k(x, 8)
  np.testing.assert_array_equal(ids, expected_ids)
  np.testing.assert_array_equal(values, expected_values)


@pytest.mark.parametrize("columns", [40, 1000, 1024, 2178])
def test_top_k_of_a_width_unknown_in_the_graph_is_tf_top_k(columns):
  """A shortlist's width varies by request: blocks chosen at run time
  (TopKV2 below 4 k SHORTLIST_BLOCK columns, 1,024 here)."""
  top_k = tf.function(lambda x: beam_search.top_k(x, 8),
                      input_signature=[tf.TensorSpec([None, None])])
  x = tf.random.stateless_normal([6, columns], seed=[2, columns])
  values, ids = top_k(x)
  expected_values, expected_ids = tf.math.top_k(x, 8)
  np.testing.assert_array_equal(ids, expected_ids)
  np.testing.assert_array_equal(values, expected_values)


@pytest.fixture(scope="module", name="trained")
def _trained(trained_numbers_run):
  """(model, vocabulary) of the session's trained run, loaded once."""
  return run_dir.load_trained_model(str(trained_numbers_run))


def test_results_do_not_depend_on_when_sentences_leave(trained, monkeypatch):
  """Done sentences leave the batch when a quarter of it is done; leaving at
  once, never (XLA's static shapes) or decoding alone gives the same."""
  model, vocabulary = trained
  texts = [s for s, _ in numbers.generate({"test": 24}, seed=3)["test"]]
  sources = _source_ids(vocabulary, texts)
  search = lambda s: model_beam_search(model, s, beam_size=4, alpha=0.6,
                                       max_length_offset=10)
  ids, scores = search(sources)
  lengths = (ids[:, 0].numpy() != PAD_ID).sum(-1)
  assert lengths.min() < lengths.max() - 3  # sentences do end apart
  monkeypatch.setattr(beam_search, "RETIRE_FRACTION", 10**6)
  at_once = search(sources)
  monkeypatch.setattr(beam_search, "RETIRE_FRACTION", 1)
  at_end = search(sources)
  rows = [_strip(row) for row in sources.numpy()]
  for other_ids, other_scores in (at_once, at_end):
    apart = lines_apart(model, rows, ids.numpy(), other_ids.numpy(),
                        max_length_offset=10)
    # Other batch shapes from the step on which sentences leave: other
    # kernels, each within its float32 bound (rounding.py).
    _within_where_same(model, rows, apart, scores, other_scores, ids)
  for row in (0, 7, 23):
    alone = _source_ids(vocabulary, texts[row:row + 1])
    one_ids, one_scores = search(alone)
    apart = lines_apart(model, rows[row:row + 1], ids.numpy()[row:row + 1, :1],
                        one_ids.numpy()[:, :1], max_length_offset=10)
    _within_where_same(model, rows[row:row + 1], apart,
                       scores[row:row + 1, :1], one_scores[:, :1],
                       ids[row:row + 1, :1])


@functools.cache
def _in_parts(model, options):
  """`decode` with `options` (parts > 1) as one tf.function for every
  batch shape: the test's batch sizes share its trace."""
  return tf.function(lambda s: decode(model, s, options), input_signature=[
      tf.TensorSpec([None, None], tf.int32)])


@pytest.mark.parametrize("rows,method", [
    pytest.param(24, "beam", marks=pytest.mark.slow),
    pytest.param(1, "beam", marks=pytest.mark.slow),
    (0, "beam"), (24, "greedy"), (1, "greedy")])
def test_decoding_in_parts_gives_what_one_loop_gives(trained, rows, method):
  model, vocabulary = trained
  texts = [s for s, _ in numbers.generate({"test": 24}, seed=5)["test"]]
  sources = _source_ids(vocabulary, texts)[:rows]
  options = DecodingOptions(method=method, max_decode_length_offset=10)
  ids, scores = decode(model, sources, options)
  lines = [_strip(row) for row in sources.numpy()]
  for parts in (2, 3):
    part_ids, part_scores = _in_parts(
        model, dataclasses.replace(options, parts=parts))(sources)
    assert part_ids.shape[0] == rows
    apart = lines_apart(model, lines, ids.numpy(), part_ids.numpy(),
                        options.nbest, max_length_offset=10)
    _within_where_same(model, lines, apart, scores, part_scores, ids)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["beam", "greedy"])
def test_bucketed_xla_search_needs_shapes_only_and_decodes_alike(
    trained, method):
  """The XLA export's search (`DecodingOptions.xla`): its program builds
  from a shape alone (no input value decides a buffer size), requests of 3
  and 4 sentences in one length bucket share one program, and every batch
  decodes as without XLA."""
  model, vocabulary = trained
  options = DecodingOptions(method=method, max_decode_length_offset=10)
  xla = dataclasses.replace(options, xla=True)
  bucketed = tf.function(lambda ids: decode(model, ids, xla))
  texts = [s for s, _ in numbers.generate({"test": 12}, seed=6)["test"]]
  sources = _source_ids(vocabulary, texts)
  requests = (slice(0, 3), slice(3, 7), slice(7, 8), slice(8, 12))
  shapes = set()
  for rows in requests:
    ids, scores = decode(model, sources[rows], options)
    xla_ids, xla_scores = bucketed(sources[rows])
    assert xla_ids.shape[:2] == ids.shape[:2]
    lines = [_strip(r) for r in sources[rows].numpy()]
    apart = lines_apart(model, lines, ids.numpy(), xla_ids.numpy(),
                        options.nbest, max_length_offset=10)
    _within_where_same(model, lines, apart, scores, xla_scores, ids)
    shapes.add((int(search._next_power_of_2(ids.shape[0])),  # pylint: disable=protected-access
                -(-sources.shape[1] // search.LENGTH_BUCKET)))
  # One program per (power-of-2 rows, length bucket): sizes 3 and 4 of a
  # bucket share one. Its program builds from a shape alone.
  compiled = search._compiled_search(model, xla, None, False)  # pylint: disable=protected-access
  assert compiled.experimental_get_tracing_count() == len(shapes) < len(
      requests)
  hlo = compiled.experimental_get_compiler_ir(
      tf.TensorSpec([4, search.LENGTH_BUCKET], tf.int32))(stage="hlo")
  assert "while" in hlo


def test_bucket_rows_are_powers_of_2():
  sizes = tf.constant([1, 2, 3, 4, 5, 31, 32, 33, 1000])
  np.testing.assert_array_equal(search._next_power_of_2(sizes),
                                [1, 2, 4, 4, 8, 32, 32, 64, 1024])
