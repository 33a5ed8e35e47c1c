"""TF Serving's server-side batching (`--enable_batching`) concatenates
requests on dimension 0, runs the signature once and splits every output on
dimension 0 (padding variable-length outputs to the batch's longest). Each
signature of an export must give a request the same answer that way as
alone: here, two requests and their concatenation through the loaded
SavedModel, the concatenation's outputs split and compared with each
request's own, padding aside."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the ops the graph uses)

from bench import server_batching
from conftest import TRAINED_EXPORT, load_saved_model
from float32_bounds import LOG_PROB, sentence
from tf_transformer.data import numbers

PAIRS = numbers.generate({"test": 7}, seed=11)["test"]
FIRST = [s for s, _ in PAIRS[:3]]  # requests of different lengths and sizes
SECOND = [s for s, _ in PAIRS[3:]]
TARGETS = [t for _, t in PAIRS]
# The longest output the trained export gives (its input limit + offset, EOS).
LONGEST = (TRAINED_EXPORT["max_input_tokens"]
           + TRAINED_EXPORT["max_decode_length_offset"] + 1)


@pytest.fixture(scope="module")
def loaded(trained_export):
  return load_saved_model(trained_export)


def _strings(values):
  return tf.constant(values, tf.string, shape=[len(values)])


def _padded(alone, shape):
  """`alone` padded at the end of each axis to `shape` with the padding
  the signature uses ("" or 0)."""
  alone = np.asarray(alone)
  assert alone.ndim == len(shape)
  assert all(a <= s for a, s in zip(alone.shape, shape))
  widths = [(0, s - a) for a, s in zip(alone.shape, shape)]
  fill = b"" if alone.dtype.kind in "SO" else 0
  return np.pad(alone, widths, constant_values=fill)


def _bound(name):
  """How far a batch's output may be from a request's own: two batch
  shapes are two paths (float32_bounds), and a sentence's score sums its
  tokens' log-probabilities; attention weights stay within LOG_PROB."""
  return sentence(LONGEST) if name in ("score", "scores", "log_prob") else (
      LOG_PROB)


def _split_equals_alone(function, first, second, text_key=None,
                        score_key=None):
  """Calls `function` on each request and on their concatenation; every
  output of the concatenation split on dimension 0 equals the request's own
  (padded as the server pads). Where a translation differs (`text_key`),
  rounding tipped a near-tie: its score (`score_key`) must then agree
  within float32 rounding, and the row is not compared further."""
  both = {name: tf.concat([first[name], second[name]], 0) for name in first}
  together = {k: v.numpy() for k, v in function(**both).items()}
  rows = len(next(iter(first.values())))
  for part, request in ((slice(0, rows), first), (slice(rows, None), second)):
    alone = {k: v.numpy() for k, v in function(**request).items()}
    assert set(alone) == set(together)
    same = np.ones(len(alone[next(iter(alone))]), bool)
    if text_key:
      split = together[text_key][part]
      same = np.array([np.array_equal(a, b) for a, b in zip(
          _padded(alone[text_key], split.shape), split)])
      if score_key:
        np.testing.assert_allclose(alone[score_key][~same],
                                   together[score_key][part][~same],
                                   rtol=0, atol=_bound(score_key))
    for name, value in together.items():
      split = value[part]
      assert split.shape[0] == alone[name].shape[0], name
      expected = _padded(alone[name], split.shape)[same]
      if split.dtype.kind in "SOiub":
        np.testing.assert_array_equal(split[same], expected, err_msg=name)
      else:
        np.testing.assert_allclose(split[same], expected, rtol=0,
                                   atol=_bound(name), err_msg=name)


@pytest.mark.parametrize("signature", ["serving_default", "nbest",
                                       "attention"])
def test_text_signatures_split_as_they_were_sent(loaded, signature):
  key = {"serving_default": ("translation", "score"),
         "nbest": ("translations", "scores"),
         "attention": ("translation", None)}[signature]
  function = loaded.signatures[signature]
  _split_equals_alone(function, {"text": _strings(FIRST)},
                      {"text": _strings(SECOND)}, *key)


def test_prefix_and_score_signatures_split_as_they_were_sent(loaded):
  _split_equals_alone(
      loaded.signatures["translate_with_prefix"],
      {"text": _strings(FIRST), "prefix": _strings(["", "drei", ""])},
      {"text": _strings(SECOND), "prefix": _strings(["", "", "vier", ""])},
      "translation", "score")
  for name in ("score", "forced_alignment"):
    _split_equals_alone(
        loaded.signatures[name],
        {"source": _strings(FIRST), "target": _strings(TARGETS[:3])},
        {"source": _strings(SECOND), "target": _strings(TARGETS[3:])})


def test_ids_signature_splits_as_it_was_sent(loaded):
  ids = loaded.source_ids(_strings(FIRST + SECOND))["source_ids"]
  _split_equals_alone(loaded.signatures["ids"], {"source_ids": ids[:3]},
                      {"source_ids": ids[3:]}, "target_ids", "score")


@pytest.mark.slow
def test_batching_op_serves_concurrent_clients_as_alone(loaded):
  """benchmarks/server_batching.py's measure: 4 clients through TF Serving's
  batching op (concurrent one-sentence calls merged on dimension 0) get
  what each sentence gets alone, and the figures are filled in."""
  serve = loaded.signatures["serving_default"]
  translate = lambda text: serve(text=text)["translation"]
  sentences = [s for s, _ in numbers.generate({"test": 12}, seed=5)["test"]]
  alone = [translate(tf.constant([s])).numpy()[0].decode() for s in sentences]
  rows = server_batching.compare(
      translate, sentences,
      [server_batching.Setting(), server_batching.Setting(2, 2000, 8)],
      clients=4, rounds=1)
  assert [r["setting"] for r in rows] == [
      "no batching", "2 batch thread(s), 2000 us, up to 8"]
  for r in rows:
    assert r["same"] == len(sentences)
    assert r["sentences_per_second"] > 0 and r["cpu_seconds"] >= 0
    assert 0 < r["p50_ms"] <= r["p99_ms"]
  calls = server_batching.concurrent_clients(
      server_batching.batched(translate, server_batching.Setting(1, 5000, 8)),
      sentences, 4)
  assert calls["outputs"] == alone
