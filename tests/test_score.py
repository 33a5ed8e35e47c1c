"""Scoring given translations (forced decoding): the export's `score`
signature gives the model's own teacher-forced log-probabilities, answers
odd requests, and bin/score.py prints them for an export or a run; the
`forced_alignment` signature adds the teacher-forced attention word
alignments are made of."""

import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the ops the graph uses)

from tf_transformer.data import numbers
from tf_transformer.decoding import alignment
from tf_transformer.run import run_dir
from tf_transformer.translators.scorer import Scorer
from tf_transformer.special_ids import BOS_ID, EOS_ID
from conftest import TRAINED_EXPORT, load_saved_model, run_script
import rounding
from training_helpers import token_log_probs

pytestmark = pytest.mark.numeric

# conftest.trained_export's: above the longest source here (18 subwords), so
# that nothing is cut but the long requests.
MAX_INPUT_TOKENS, OFFSET = (TRAINED_EXPORT["max_input_tokens"],
                            TRAINED_EXPORT["max_decode_length_offset"])
PAIRS = numbers.generate({"test": 24}, seed=11)["test"]
SOURCES = [s for s, _ in PAIRS]
REFERENCES = [t for _, t in PAIRS]


@pytest.fixture(name="exported", scope="module")
def _exported(trained_export):
  return trained_export


@pytest.fixture(scope="module")
def score(exported):
  loaded = load_saved_model(exported)
  signature = loaded.signatures["score"]

  def call(sources, targets):
    strings = lambda texts: tf.constant(texts, tf.string, shape=[len(texts)])
    return {k: v.numpy() for k, v in signature(
        source=strings(sources), target=strings(targets)).items()}
  call.signature = signature
  return call


def test_equals_the_models_teacher_forced_log_probs(trained_numbers_run,
                                                    score):
  model, vocab = run_dir.load_trained_model(str(trained_numbers_run))
  processor = spm.SentencePieceProcessor(model_proto=vocab.model_proto)
  # The references, and wrong targets (another pair's) the model dislikes.
  targets = REFERENCES + REFERENCES[1:] + REFERENCES[:1]
  sources = SOURCES + SOURCES
  out = score(sources, targets)
  expected = token_log_probs(model, processor, sources, targets)
  # Two paths (the export's graph, the Keras model's eager calls), each
  # within its float32 rounding bound of the exact values (rounding.py).
  exact, bound = rounding.token_bounds(
      model, [processor.encode(s) + [EOS_ID] for s in sources],
      [processor.encode(t) + [EOS_ID] for t in targets])
  for row, want in enumerate(expected):
    length = out["lengths"][row]
    assert length == len(want)  # subwords + EOS
    got = out["token_log_probs"][row, :length]
    rounding.assert_within(got, exact[row, :length], bound[row, :length])
    rounding.assert_within(want, exact[row, :length], bound[row, :length])
    # The bound tells a position off by one apart.
    assert np.all(np.abs(got[1:] - exact[row, :length - 1])
                  > 2 * bound[row, :length - 1])
    assert np.all(out["token_log_probs"][row, length:] == 0)
  rounding.assert_within(out["log_prob"], exact[:, -1], bound[:, -1])
  # The same numbers summed in another order.
  rounding.assert_within(out["log_prob"], out["token_log_probs"].sum(axis=1),
                         rounding.sum_bound(out["token_log_probs"]))
  right, wrong = np.split(out["log_prob"], 2)
  # The trained model knows its task: its references are far likelier than
  # another pair's (by 24.6-31.3 nats on average on 9 numbers models, where
  # the share of pairs so ordered, 23 or 24 of 24, rested on a line or two).
  assert np.mean(right) > np.mean(wrong) + 1.0
  assert np.all(out["log_prob"] < 0)


def test_odd_requests_get_defined_answers(score):
  empty = score([], [])
  assert empty["log_prob"].shape == (0,)
  assert empty["token_log_probs"].shape == (0, 0)
  assert empty["lengths"].shape == (0,)
  out = score(["seven", "", "nine " * 200, "seven", "\xff seven"],
              ["", "sieben", "neun", "neun " * 200, "sieben"])
  assert out["lengths"][0] == 1  # an empty target: the EOS alone
  # A target longer than any output the export gives is cut to it.
  assert out["lengths"][3] == MAX_INPUT_TOKENS + OFFSET + 1
  assert np.all(np.isfinite(out["log_prob"]))
  # The signature's metadata says the token axis varies (TF Serving
  # clients read it).
  shape = score.signature.structured_outputs["token_log_probs"].shape
  assert shape.as_list() == [None, None]
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="source and target must hold as many strings"):
    score(["seven", "eight"], ["sieben"])
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"Shape of tensor source \[2,1\] is not compatible"):
    score.signature(source=tf.constant([["seven"], ["eight"]]),
                    target=tf.constant(["a", "b"]))


@pytest.mark.slow  # every layer's attention of a trained run's export
def test_forced_alignment_is_the_teacher_forced_attention_of_the_target(
    trained_numbers_run, exported, score):
  """The `forced_alignment` signature: `score`'s outputs, and each decoder
  layer's encoder-decoder attention averaged over its heads in the Keras
  model's teacher-forced pass over the given target (within float32
  rounding), whose argmax pairs are the alignment (unless a subword's two
  most attended source pieces are within that rounding)."""
  model, vocab = run_dir.load_trained_model(str(trained_numbers_run))
  processor = spm.SentencePieceProcessor(model_proto=vocab.model_proto)
  signature = load_saved_model(exported).signatures["forced_alignment"]
  sources, targets = SOURCES[:12], REFERENCES[:12]
  out = {k: v.numpy() for k, v in signature(
      source=tf.constant(sources), target=tf.constant(targets)).items()}
  scored = score(sources, targets)
  source_ids = [processor.encode(s) + [EOS_ID] for s in sources]
  target_ids = [processor.encode(t) + [EOS_ID] for t in targets]
  _, bound = rounding.token_bounds(model, source_ids, target_ids)
  # One teacher-forced function in both signatures, each within the float32
  # bound of the exact values.
  np.testing.assert_array_equal(out["lengths"], scored["lengths"])
  rounding.assert_within(out["log_prob"], scored["log_prob"],
                         2 * bound[:, -1])
  rounding.assert_within(out["token_log_probs"], scored["token_log_probs"],
                         2 * bound[:, :-1])
  layers = model.config.model.num_layers
  assert out["cross_attention"].shape[:2] == (12, layers)
  pairs = alignment.from_attention(out, layer=1)
  # What bin/score.py --alignment prints: the same numbers and pairs.
  from_scorer = Scorer.from_export(exported, True, 1).score(sources, targets)
  assert [p for _, _, p in from_scorer] == pairs
  # Its batches are not the signature's: other shapes, other kernels.
  rounding.assert_within([t for t, _, _ in from_scorer], scored["log_prob"],
                         2 * bound[:, -1])
  pieces = [ids[:-1] for ids in target_ids]
  attention = [rounding.attention_bounds(model, source_ids, pieces,
                                         layer=layer)
               for layer in range(layers)]
  near_ties = 0
  for row, (source, target) in enumerate(zip(sources, targets)):
    source_length, target_length = len(source_ids[row]), len(pieces[row])
    assert [t.decode() for t in out["target_tokens"][row] if t] == [
        processor.id_to_piece(i) for i in pieces[row]] + ["</s>"]
    weights = model.attention_weights(
        tf.constant([source_ids[row]]),
        tf.constant([[BOS_ID] + pieces[row]]))
    for layer, (exact, bound) in enumerate(attention):
      want = weights["encoder_decoder"][layer][0].numpy().mean(axis=0)
      got = out["cross_attention"][row, layer]
      cut = lambda a: a[:target_length + 1, :source_length]
      rounding.assert_within(cut(got), cut(exact[row]), cut(bound[row]))
      rounding.assert_within(want, cut(exact[row]), cut(bound[row]))
      assert np.all(got[target_length + 1:] == 0)  # padding rows
    # An argmax of two paths' weights may differ only where the two most
    # attended pieces lie within both paths' bounds of each other: the
    # Keras model's gap within 4 bounds (its own two, the export's two).
    exact, bound = (a[row][:target_length, :source_length - 1]
                    for a in attention[0])
    first = out["cross_attention"][row, 0][:target_length,
                                           :source_length - 1]
    order = np.argsort(first, axis=1)[:, -2:]
    top_two = np.take_along_axis(first, order, 1)
    if np.any(top_two[:, 1] - top_two[:, 0] <= 4 * np.take_along_axis(
        bound, order, 1).max(1)):
      near_ties += 1
      continue
    want_pairs = alignment.hard_alignment(
        weights["encoder_decoder"][0][0].numpy().mean(axis=0),
        [p.encode() for p in processor.encode(source, out_type=str)],
        [p.encode() for p in processor.encode(target, out_type=str)])
    assert pairs[row] == alignment.pharaoh(want_pairs), (source, target)
  assert near_ties < len(sources) // 2
  empty = {k: v.numpy() for k, v in signature(
      source=tf.constant([], tf.string), target=tf.constant([], tf.string)
  ).items()}
  assert empty["cross_attention"].shape == (0, layers, 0, 0)
  assert empty["source_tokens"].shape == (0, 0)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="source and target must hold as many strings"):
    signature(source=tf.constant(["seven", "eight"]),
              target=tf.constant(["sieben"]))
  with pytest.raises(ValueError, match="--alignment_layer=3: the model's "
                     "decoder has layers 1 to 2"):
    Scorer.from_export(exported, True, 3).score(sources, targets)


def _score_lines(*args):
  result = run_script("score.py", *args)
  assert result.returncode == 0, result.stderr[-2000:]
  return [line.split("\t") for line in result.stdout.splitlines()]


@pytest.mark.slow
def test_bin_score_gives_the_same_for_the_export_and_the_run(
    trained_numbers_run, exported, score, tmp_path):
  source, target = tmp_path / "source.txt", tmp_path / "target.txt"
  source.write_text("".join(s + "\n" for s in SOURCES[:6]), encoding="utf-8")
  target.write_text("".join(t + "\n" for t in REFERENCES[:6]),
                    encoding="utf-8")
  files = [f"--source={source}", f"--target={target}"]
  from_export = _score_lines(f"--model={exported}", *files, "--tokens",
                             "--alignment")
  # The run's pairs in two buffers of 3: the same lines, in input order.
  from_run = _score_lines(f"--model={trained_numbers_run}", *files,
                          "--alignment", "--buffer_lines=3")
  want = score(SOURCES[:6], REFERENCES[:6])
  assert len(from_export) == len(from_run) == 6
  model, vocab = run_dir.load_trained_model(str(trained_numbers_run))
  processor = spm.SentencePieceProcessor(model_proto=vocab.model_proto)
  _, sentences = rounding.token_bounds(
      model, [processor.encode(s) + [EOS_ID] for s in SOURCES[:6]],
      [processor.encode(t) + [EOS_ID] for t in REFERENCES[:6]])
  # Printed to 4 decimals (each within 5e-5), by batches of other shapes:
  # two paths, each within its float32 bound.
  bound = lambda row: 5e-5 + 2 * sentences[row, -1]
  for row, (fields, run_fields) in enumerate(zip(from_export, from_run)):
    assert float(fields[0]) == pytest.approx(want["log_prob"][row],
                                             abs=bound(row))
    assert int(fields[1]) == want["lengths"][row]
    values = [float(v) for v in fields[2].split()]
    assert len(values) == int(fields[1])
    # Each value and the total printed to 4 decimals.
    assert sum(values) == pytest.approx(
        float(fields[0]), abs=(len(values) + 1) * 5e-5)
    assert len(run_fields) == 3
    assert float(run_fields[0]) == pytest.approx(float(fields[0]),
                                                 abs=5e-5 + bound(row))
    # The alignment last: word pairs inside both lines, every target word
    # aligned, the same from the export and the run (one float32 graph).
    pairs = [tuple(map(int, p.split("-"))) for p in fields[3].split()]
    assert all(0 <= s < len(SOURCES[row].split()) and
               0 <= t < len(REFERENCES[row].split()) for s, t in pairs)
    assert {t for _, t in pairs} == set(range(len(REFERENCES[row].split())))
    assert run_fields[2] == fields[3]


def test_bin_score_names_bad_input(exported, tmp_path):
  source, target = tmp_path / "source.txt", tmp_path / "target.txt"
  source.write_text("seven\neight\n", encoding="utf-8")
  target.write_text("sieben\n", encoding="utf-8")
  result = run_script("score.py", f"--model={exported}",
                      f"--source={source}", f"--target={target}")
  assert result.returncode == 2
  assert (f"--source={source} has 2 lines but --target={target} has 1"
          in result.stderr)
  result = run_script("score.py", f"--model={tmp_path}",
                      f"--source={source}", f"--target={source}")
  assert result.returncode == 1
  assert "neither a SavedModel version" in result.stderr
  result = run_script("score.py", f"--model={exported}",
                      f"--source={source}", f"--target={source}",
                      "--alignment", "--alignment_layer=5")
  assert result.returncode == 1
  assert ("--alignment_layer=5: the model's decoder has layers 1 to 2"
          in result.stderr), result.stderr[-2000:]


def test_length_batches_hold_their_budget_and_results_keep_input_order():
  """With batch_tokens, a Scorer sorts pairs by their longer side and cuts
  batches within the budget (longest side x pairs), longest first; results
  come back in input order."""
  batches = []

  def batch_fn(sources, targets):
    batches.append(list(zip(sources, targets)))
    return [(-float(len(t.split())), [0.0]) for t in targets]

  sources = ["a b c", "a", "a b c d e f g", "a b", "a b c d"]
  targets = ["x", "x y z w", "x y", "x y z", "x"]
  # Counted as whitespace words (+ 1 for EOS, as `token_lengths` adds).
  scorer = Scorer(batch_fn, lambda texts: ([len(t.split()) for t in texts],
                                           100))
  results = scorer.score(sources, targets, batch_tokens=10)
  assert [r[0] for r in results] == [-1.0, -4.0, -2.0, -3.0, -1.0]
  lengths = [[max(len(s.split()), len(t.split())) + 1 for s, t in batch]
             for batch in batches]
  assert lengths == [[8], [5, 5], [4, 4]]
  assert all(max(b) * len(b) <= 10 for b in lengths)
  batches.clear()
  assert scorer.score(sources, targets, batch_size=2) == results
  assert [len(b) for b in batches] == [2, 2, 1]  # file order
  assert batches[0] == [("a b c", "x"), ("a", "x y z w")]


def test_length_batches_score_as_file_order(trained_numbers_run, exported):
  """The export's scores do not depend on the batching (but for float32
  rounding); its own tokenizer counts the lengths."""
  scorer = Scorer.from_export(exported)
  by_length = scorer.score(SOURCES, REFERENCES, batch_tokens=40)
  in_order = scorer.score(SOURCES, REFERENCES, batch_size=5)
  model, vocab = run_dir.load_trained_model(str(trained_numbers_run))
  processor = spm.SentencePieceProcessor(model_proto=vocab.model_proto)
  _, bound = rounding.token_bounds(
      model, [processor.encode(s) + [EOS_ID] for s in SOURCES],
      [processor.encode(t) + [EOS_ID] for t in REFERENCES])
  for row, ((total, tokens), (want_total, want_tokens)) in enumerate(
      zip(by_length, in_order)):
    assert len(tokens) == len(want_tokens)
    # Other batch shapes, other kernels: each within its float32 bound.
    rounding.assert_within(tokens, want_tokens,
                           2 * bound[row, :len(tokens)])
    rounding.assert_within(total, want_total, 2 * bound[row, -1])


@pytest.mark.slow
def test_an_export_of_an_earlier_release_is_asked_to_export_again(
    trained_numbers_run, tmp_path):
  """A SavedModel without every signature of release 1.0 (as 0.1's
  development versions wrote before `forced_alignment` or `alignment`
  existed) is refused by name, by the translator and the scorer alike."""
  from tf_transformer.run import loading  # pylint: disable=g-import-not-at-top
  from tf_transformer.translators.translator import Translator  # pylint: disable=g-import-not-at-top
  module = loading.translation_module(str(trained_numbers_run))
  path = str(tmp_path / "before")
  tf.saved_model.save(module, path, signatures={
      "score": module.score, "nbest": module.nbest})
  for load in (Scorer.from_export, Translator.from_export):
    with pytest.raises(ValueError, match=r"before: an export of a release "
                       r"before 1\.0 \(it has no serving_default, ids, "
                       r"translate_with_prefix, attention, alignment, "
                       r"forced_alignment\): export it again"):
      load(path)
