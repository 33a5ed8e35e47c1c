"""Ensembles (decoding/ensemble.py): the step combines the members'
distributions; an ensemble of one, or of a model with itself, translates as
the model does; one SavedModel holds several runs; members of another
vocabulary are refused."""

import keras
import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf

from tf_transformer import build_model, get_config
from tf_transformer.decoding import search
from tf_transformer.decoding.ensemble import Ensemble
from tf_transformer.decoding.ensemble import EnsembleStep
from tf_transformer.decoding.step import Step
from tf_transformer.translators.translator import Translator
from tf_transformer.data import prepare
from tf_transformer.run import loading
from tf_transformer.run import run_dir
from tf_transformer.run.runner import Runner
from tf_transformer.special_ids import BOS_ID, EOS_ID, PAD_ID
from conftest import TRAINED_EXPORT, run_script
import rounding
from search_reference import lines_apart
from training_helpers import SPEC, write_run_dir

pytestmark = pytest.mark.numeric

SOURCE = tf.constant([[5, 6, 7, 9, EOS_ID], [8, 11, EOS_ID, PAD_ID, PAD_ID]])
TEXTS = ["four hundred and twenty-one", "seven", "thirty thousand and two"]


def _model(seed, overrides=""):
  keras.utils.set_random_seed(seed)
  return build_model(get_config("tiny", ",".join(
      o for o in ("vocab_size=40,dropout_rate=0.0", overrides) if o)))


def _decode(model, method):
  options = search.DecodingOptions(method=method, max_decode_length_offset=6)
  return tf.function(lambda ids: search.decode(model, ids, options))(SOURCE)


# The beam case is the slow tier's (twice greedy's time, the same members'
# arithmetic).
@pytest.mark.parametrize("method", [pytest.param("beam", marks=pytest.mark.slow),
                                    "greedy"])
def test_an_ensemble_of_one_or_of_a_model_with_itself_decodes_as_the_model(
    method):
  model = _model(1)
  ids, scores = _decode(model, method)
  sources = rounding.unpadded(SOURCE)
  beam = 4 if method == "beam" else 1
  model_bound = rounding.search_bounds(model, sources, ids.numpy())
  for ensemble in (Ensemble([model]), Ensemble([model, model]),
                   Ensemble([model, model], average="probs")):
    got_ids, got_scores = _decode(ensemble, method)
    # The ensemble's step and the model's: two paths, the same outputs but
    # at near ties (tests/search_reference.py), the same scores within
    # both paths' bounds (rounding.py; the ensemble's own roundings too).
    apart = lines_apart(ensemble, sources, ids.numpy(), got_ids.numpy(),
                        beam_size=beam, max_length_offset=6)
    same = np.array([line not in apart for line in range(len(sources))])
    bound = model_bound + rounding.search_bounds(ensemble, sources,
                                                 ids.numpy())
    rounding.assert_within(got_scores.numpy()[same], scores.numpy()[same],
                           bound[same])


@pytest.mark.parametrize("average", ["log_probs", "probs"])
def test_each_step_combines_the_members_distributions(average):
  """Members of other shapes (depth, width, heads) in one ensemble: its
  step and its teacher-forced pass give the members' log-softmax outputs
  averaged (or their probabilities averaged, in log space)."""
  members = [_model(1), _model(2, "num_layers=1,d_model=32,num_heads=2,"
                                  "d_k=16,d_v=16,d_ff=64")]
  ensemble = Ensemble(members, average)

  def combined(log_probs):
    if average == "log_probs":
      return np.mean(log_probs, axis=0)
    return np.log(np.mean(np.exp(log_probs), axis=0))

  ids = tf.fill([4, 1], BOS_ID)

  def first_step(step):
    weights = step.prepare(8)
    memory, source_mask = step.encode(SOURCE)
    return step(ids, 0, step.initial_cache(weights, memory, 8, 2),
                source_mask, weights)[0]
  got = first_step(EnsembleStep(ensemble))
  expected = [tf.nn.log_softmax(first_step(Step(m))).numpy() for m in members]
  # Two paths: the ensemble's step, and each member's step combined here in
  # float64; each within the ensemble's bound (rounding.py: its members'
  # roundings and the combination's).
  sources = rounding.unpadded(tf.repeat(SOURCE, 2, axis=0))
  _, bound = rounding.next_token_bounds(ensemble, sources, [[]] * 4,
                                        renormalized=False)
  rounding.assert_within(got, combined(expected), 2 * bound)

  target_in = tf.constant([[BOS_ID, 5, 6], [BOS_ID, 7, PAD_ID]])
  prefixes = [[5, 6][:t] for t in range(3)] + [[7][:t] for t in range(2)]
  _, bound = rounding.next_token_bounds(
      ensemble, [rounding.unpadded(SOURCE)[0]] * 3
      + [rounding.unpadded(SOURCE)[1]] * 2, prefixes, renormalized=False)
  got = ensemble((SOURCE, target_in)).numpy()
  want = combined([tf.nn.log_softmax(m((SOURCE, target_in))).numpy()
                   for m in members])
  real = [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
  rounding.assert_within(np.stack([got[r, t] for r, t in real]),
                         np.stack([want[r, t] for r, t in real]), 2 * bound)
  # A beam search over both runs, with sentences leaving the batch.
  ids, scores = _decode(ensemble, "beam")
  assert ids.shape[:2] == (2, 4) and np.all(np.isfinite(scores))


@pytest.mark.slow  # two models' search in one graph: the costliest here
def test_one_pass_gives_the_logits_and_the_attention_of_two():
  """`logits_and_attention` (the export's forced alignment) of a model, an
  ensemble of members of one shape (attention averaged) and one of other
  shapes (the lead's attention): the teacher-forced call's logits and
  `attention_weights`' distributions, within float32 rounding."""
  target_in = tf.constant([[BOS_ID, 5, 6, 9], [BOS_ID, 7, PAD_ID, PAD_ID]])
  small = "num_layers=1,d_model=32,num_heads=2,d_k=16,d_v=16,d_ff=64"
  sources = rounding.unpadded(SOURCE)
  targets = [[5, 6, 9], [7]]
  real = [(row, t) for row, target in enumerate(targets)
          for t in range(len(target) + 1)]
  for model in (_model(1), Ensemble([_model(1), _model(2)]),
                Ensemble([_model(1), _model(2, small)], "probs")):
    logits, attention = model.logits_and_attention(SOURCE, target_in)
    # Two passes (the weights' attention kernels and the fused ones), each
    # within its bound (rounding.py), at the real target positions: the
    # model's logits, or an ensemble's combined log-probabilities.
    prefixes = [targets[row][:t] for row, t in real]
    rows = [sources[row] for row, _ in real]
    _, bound = (rounding.logit_bounds(model, rows, prefixes)
                if isinstance(model, keras.Model) else
                rounding.next_token_bounds(model, rows, prefixes,
                                           renormalized=False))
    want = model((SOURCE, target_in)).numpy()
    rounding.assert_within(np.stack([logits.numpy()[r, t] for r, t in real]),
                           np.stack([want[r, t] for r, t in real]), 2 * bound)
    expected = model.attention_weights(SOURCE, target_in)
    assert set(attention) == set(expected) == {
        "encoder_self", "decoder_self", "encoder_decoder"}
    for kind, layers in expected.items():
      assert len(attention[kind]) == len(layers) == 2  # the lead's depth
      for layer, (got, want) in enumerate(zip(attention[kind], layers)):
        _, bound = rounding.attention_bounds(model, sources, [
            t[:-1] for t in targets], kind, layer, heads=True)
        for row, (source, target) in enumerate(zip(sources, targets)):
          queries = len(source) if kind == "encoder_self" else len(target)
          keys = len(target) if kind == "decoder_self" else len(source)
          cut = lambda a: np.asarray(a)[row, :, :queries, :keys]
          rounding.assert_within(cut(got), cut(want), 2 * cut(bound),
                                 f"{kind} {layer}")


def test_members_of_another_vocabulary_are_refused(tmp_path):
  with pytest.raises(ValueError, match="vocabularies differ in size"):
    Ensemble([_model(1), _model(2, "vocab_size=50")])
  with pytest.raises(ValueError, match="average="):
    Ensemble([_model(1)], average="max")
  first = write_run_dir(tmp_path / "a")
  other = tmp_path / "b"
  write_run_dir(other)
  prepare.build_vocabulary(SPEC, 300).save(str(other))
  with pytest.raises(ValueError, match=f"--model_dir={other} has another "
                     f"vocabulary than --model_dir={first}"):
    loading.trained([str(first), str(other)])
  with pytest.raises(ValueError, match="give each member's checkpoint"):
    loading.trained([str(first), str(first)], checkpoint="x/ckpt-1")
  with pytest.raises(ValueError, match="only as --format=saved_model"):
    Runner(str(first)).export(str(tmp_path / "ct2"), format="ctranslate2",
                              ensemble=[str(first)])


@pytest.mark.slow
def test_one_saved_model_of_a_run_with_its_checkpoint_translates_as_the_run(
    trained_numbers_run, trained_export, tmp_path):
  """bin/export.py's ensemble path (a run and a checkpoint path, here of
  the same weights) gives one SavedModel with the usual signatures and the
  single export's translations; bin/translate.py takes several
  --model_dir the same way."""
  run = str(trained_numbers_run)
  checkpoint = tf.train.latest_checkpoint(run)
  offset = TRAINED_EXPORT["max_decode_length_offset"]
  path = Runner(run).export(str(tmp_path / "ensemble"), **TRAINED_EXPORT,
                            ensemble=[checkpoint])
  single = Translator.from_export(str(trained_export)).translate(TEXTS, 4)
  ensemble = Translator.from_export(path).translate(TEXTS, 4)
  model, vocab = run_dir.load_trained_model(run)
  processor = spm.SentencePieceProcessor(model_proto=vocab.model_proto)
  sources = [ids + [EOS_ID] for ids in processor.encode(TEXTS)]
  subwords = lambda nbest: [processor.encode([t for t, _ in h]) for h in nbest]
  # Equal weights average to the same log-probabilities, up to rounding.
  apart = lines_apart(model, sources, subwords(single), subwords(ensemble),
                      max_length_offset=offset)
  for line in set(range(len(TEXTS))) - set(apart):
    assert [t for t, _ in ensemble[line]] == [t for t, _ in single[line]]
    # Each within its bound (rounding.py): the model's, the ensemble's.
    outputs = [ids + [EOS_ID] for ids in subwords(single)[line]]
    bound = (rounding.output_bounds(model, [sources[line]] * len(outputs),
                                    outputs)
             + rounding.output_bounds(Ensemble([model, model]),
                                      [sources[line]] * len(outputs),
                                      outputs))
    rounding.assert_within([s for _, s in ensemble[line]],
                           [s for _, s in single[line]], bound)
  loaded = tf.saved_model.load(path)
  assert set(loaded.signatures) >= {"serving_default", "score", "attention"}
  scored = loaded.signatures["score"](source=tf.constant(TEXTS[:1]),
                                      target=tf.constant([single[0][0][0]]))
  assert float(scored["log_prob"][0]) < 0

  result = run_script("translate.py", f"--model_dir={run}",
                      f"--model_dir={checkpoint}",
                      f"--max_length_offset={offset}",
                      "--ensemble_average=probs",
                      input_text="".join(t + "\n" for t in TEXTS))
  assert result.returncode == 0, result.stderr[-2000:]
  lines = result.stdout.splitlines()
  assert len(lines) == len(TEXTS)
  lines_apart(model, sources, [[processor.encode(t)] for t in lines],
              [[processor.encode(h[0][0])] for h in single],
              max_length_offset=offset)
