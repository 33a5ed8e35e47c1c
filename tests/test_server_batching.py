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
import rounding
import search_reference
import sentencepiece as spm
from tf_transformer.data import numbers
from tf_transformer.run import run_dir
from tf_transformer.special_ids import EOS_ID

pytestmark = pytest.mark.numeric

PAIRS = numbers.generate({"test": 7}, seed=11)["test"]
FIRST = [s for s, _ in PAIRS[:3]]  # requests of different lengths and sizes
SECOND = [s for s, _ in PAIRS[3:]]
TARGETS = [t for _, t in PAIRS]
OFFSET = TRAINED_EXPORT["max_decode_length_offset"]


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


@pytest.fixture(scope="module")
def model(trained_numbers_run):
  """(model, SentencePiece processor) of the trained export's run."""
  model, vocab = run_dir.load_trained_model(str(trained_numbers_run))
  return model, spm.SentencePieceProcessor(model_proto=vocab.model_proto)


class _Bounds:
  """How far a batch's output may be from a request's own: two batch
  shapes are two paths, each within its float32 bound (rounding.py) of
  the exact outputs. A translation's subwords are its text's (a search may
  output another segmentation of a text in rare cases, whose bound
  differs by the order of its roundings only)."""

  def __init__(self, model, sources, targets=None, prefixes=None):
    self.model, self.processor = model
    self.sources = [list(s) if not isinstance(s, str) else self.encode(s)
                    for s in sources]
    self.targets = None if targets is None else [self.encode(t)
                                                 for t in targets]
    self.prefixes = None if prefixes is None else [
        self.processor.encode(p) for p in prefixes]
    self.outputs = None

  def encode(self, text):
    """A text's subwords and EOS."""
    text = text.decode() if isinstance(text, bytes) else text
    return self.processor.encode(text) + [EOS_ID]

  def read_pieces(self, target_tokens):
    """The outputs' own pieces (an attention signature's `target_tokens`:
    "" as padding, "</s>" last), as ids without EOS: a text's segmentation
    may be another."""
    self.pieces = [[self.processor.piece_to_id(t.decode()) for t in row
                    if t and t != b"</s>"] for row in target_tokens]

  def nbest(self, out):
    """Each line's outputs as id lists (`out`: texts, n-best texts, or
    ids padded with PAD)."""
    out = np.asarray(out)
    if out.dtype.kind in "iu":
      return [[[int(t) for t in row if t]] for row in out]
    if out.ndim == 1:
      return [[self.encode(t)] for t in out]
    return [[self.encode(t) for t in row] for row in out]

  def __call__(self, name, rows, value):
    """The bound on each element of output `name` of `rows` (its lines),
    `value` the output (its shape)."""
    model, sources = self.model, [self.sources[r] for r in rows]
    if name in ("score", "scores", "log_prob", "token_log_probs"):
      if self.targets is not None:  # the score signature's targets
        _, bound = rounding.token_bounds(model, sources,
                                         [self.targets[r] for r in rows])
        if name == "log_prob":
          return 2 * bound[:, -1]
        tokens = bound[:, :-1]
        width = value.shape[1]
        tokens = np.pad(tokens, [(0, 0), (0, max(0, width - tokens.shape[1]))])
        return 2 * tokens[:, :width]
      outputs = [self.outputs[r] for r in rows]
      return 2 * np.stack([rounding.output_bounds(
          model, sources, [o[beam] for o in outputs])
                           for beam in range(len(outputs[0]))], 1).reshape(
                               value.shape)
    # Attention, averaged over the heads: [rows, layers, queries, keys], of
    # the search's own pieces (`read_pieces`), or the given targets.
    targets = ([self.targets[r][:-1] for r in rows] if self.targets else
               [self.pieces[r] for r in rows])
    kinds = {"cross_attention": "encoder_decoder"}
    bound = np.zeros(value.shape)
    for layer in range(value.shape[1]):
      _, b = rounding.attention_bounds(model, sources, targets,
                                       kinds.get(name, name), layer)
      cut = tuple(slice(0, n) for n in bound[:, layer].shape)
      bound[:, layer] = np.pad(b, [(0, max(0, n - m)) for n, m in zip(
          bound[:, layer].shape, b.shape)])[cut]
    return 2 * bound


def _split_equals_alone(function, first, second, bounds, text_key=None,
                        score_key=None):
  """Calls `function` on each request and on their concatenation; every
  output of the concatenation split on dimension 0 equals the request's own
  (padded as the server pads), within `bounds` (a `_Bounds`, whose lines
  are the concatenation's). Where a translation differs (`text_key`), a
  decision lay within both paths' rounding (tests/search_reference.py): the
  row is not compared further."""
  both = {name: tf.concat([first[name], second[name]], 0) for name in first}
  together = {k: v.numpy() for k, v in function(**both).items()}
  if text_key:
    bounds.outputs = bounds.nbest(together[text_key])
  if "target_tokens" in together and bounds.targets is None:
    bounds.read_pieces(together["target_tokens"])
  rows = len(next(iter(first.values())))
  total = len(next(iter(both.values())))
  for part, request in ((slice(0, rows), first), (slice(rows, None), second)):
    alone = {k: v.numpy() for k, v in function(**request).items()}
    assert set(alone) == set(together)
    lines = np.arange(total)[part]
    same = np.ones(len(alone[next(iter(alone))]), bool)
    if text_key:
      split = together[text_key][part]
      same = np.array([np.array_equal(a, b) for a, b in zip(
          _padded(alone[text_key], split.shape), split)])
      search_reference.lines_apart(
          bounds.model, [bounds.sources[line] for line in lines],
          bounds.nbest(alone[text_key]), bounds.nbest(split),
          max_length_offset=OFFSET, prefixes=bounds.prefixes and [
              bounds.prefixes[line] for line in lines])
    for name, value in together.items():
      split = value[part]
      assert split.shape[0] == alone[name].shape[0], name
      expected = _padded(alone[name], split.shape)[same]
      if split.dtype.kind in "SOiub":
        np.testing.assert_array_equal(split[same], expected, err_msg=name)
        continue
      got = split[same]
      if name in ATTENTION_KINDS:
        got, expected = _heads_averaged(got), _heads_averaged(expected)
      rounding.assert_within(got, expected,
                             bounds(name, lines[same], got), name)


ATTENTION_KINDS = ("encoder_self", "decoder_self", "encoder_decoder")


def _heads_averaged(weights):
  """An attention signature's [rows, layers, heads, queries, keys] as
  [rows, layers, queries, keys]: what is compared, for the cost of one
  bound a layer instead of one a head (the splitting moves rows, which the
  heads' mean shows as well as each head)."""
  return weights.mean(axis=2)


@pytest.mark.parametrize("signature", [
    "serving_default", "nbest",
    # A bound a layer of attention weights: the file's costliest case.
    pytest.param("attention", marks=pytest.mark.slow)])
def test_text_signatures_split_as_they_were_sent(loaded, model, signature):
  key = {"serving_default": ("translation", "score"),
         "nbest": ("translations", "scores"),
         "attention": ("translation", None)}[signature]
  function = loaded.signatures[signature]
  _split_equals_alone(function, {"text": _strings(FIRST)},
                      {"text": _strings(SECOND)},
                      _Bounds(model, FIRST + SECOND), *key)


@pytest.mark.slow  # two more signatures' bounds, as the text ones split
def test_prefix_and_score_signatures_split_as_they_were_sent(loaded, model):
  prefixes = ["", "drei", "", "", "", "vier", ""]
  _split_equals_alone(
      loaded.signatures["translate_with_prefix"],
      {"text": _strings(FIRST), "prefix": _strings(prefixes[:3])},
      {"text": _strings(SECOND), "prefix": _strings(prefixes[3:])},
      _Bounds(model, FIRST + SECOND, prefixes=prefixes), "translation",
      "score")
  for name in ("score", "forced_alignment"):
    _split_equals_alone(
        loaded.signatures[name],
        {"source": _strings(FIRST), "target": _strings(TARGETS[:3])},
        {"source": _strings(SECOND), "target": _strings(TARGETS[3:])},
        _Bounds(model, FIRST + SECOND, targets=TARGETS))


def test_ids_signature_splits_as_it_was_sent(loaded, model):
  ids = loaded.source_ids(_strings(FIRST + SECOND))["source_ids"]
  _split_equals_alone(loaded.signatures["ids"], {"source_ids": ids[:3]},
                      {"source_ids": ids[3:]},
                      _Bounds(model, rounding.unpadded(ids)), "target_ids",
                      "score")


@pytest.mark.slow
def test_batching_op_serves_concurrent_clients_as_alone(loaded, model):
  """benchmarks/server_batching.py's measure: 4 clients through TF Serving's
  batching op (concurrent one-sentence calls merged on dimension 0) get
  what each sentence gets alone, and the figures are filled in. Which calls
  merge depends on their timing, so which batch shapes run does too: a
  line may differ from its translation alone only where its search met a
  decision within float32 rounding (tests/search_reference.py)."""
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
  bounds = _Bounds(model, sentences)
  results = search_reference.search(
      model[0], bounds.sources,
      alpha=model[0].config.decoding.length_penalty_alpha,
      max_length_offset=OFFSET)
  may_differ = sum(search_reference.near_tie(model[0], source, result)
                   for source, result in zip(bounds.sources, results))
  for r in rows:
    assert r["same"] >= len(sentences) - may_differ
    assert r["sentences_per_second"] > 0 and r["cpu_seconds"] >= 0
    assert 0 < r["p50_ms"] <= r["p99_ms"]
  calls = server_batching.concurrent_clients(
      server_batching.batched(translate, server_batching.Setting(1, 5000, 8)),
      sentences, 4)
  search_reference.lines_apart(
      model[0], bounds.sources, bounds.nbest(alone),
      bounds.nbest(calls["outputs"]), max_length_offset=OFFSET)
