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
from float32_bounds import ATTENTION, LOG_PROB, sentence
from search_reference import lines_apart
from training_helpers import SPEC, write_run_dir

SOURCE = tf.constant([[5, 6, 7, 9, EOS_ID], [8, 11, EOS_ID, PAD_ID, PAD_ID]])
TEXTS = ["four hundred and twenty-one", "seven", "thirty thousand and two"]


def _model(seed, overrides=""):
  keras.utils.set_random_seed(seed)
  return build_model(get_config("tiny", ",".join(
      o for o in ("vocab_size=40,dropout_rate=0.0", overrides) if o)))


def _decode(model, method):
  options = search.DecodingOptions(method=method, max_decode_length_offset=6)
  return tf.function(lambda ids: search.decode(model, ids, options))(SOURCE)


@pytest.mark.parametrize("method", ["beam", "greedy"])
def test_an_ensemble_of_one_or_of_a_model_with_itself_decodes_as_the_model(
    method):
  model = _model(1)
  ids, scores = _decode(model, method)
  for ensemble in (Ensemble([model]), Ensemble([model, model]),
                   Ensemble([model, model], average="probs")):
    got_ids, got_scores = _decode(ensemble, method)
    np.testing.assert_array_equal(got_ids, ids)
    # The ensemble's step and the model's: two paths (float32_bounds).
    np.testing.assert_allclose(got_scores, scores, rtol=0,
                               atol=sentence(ids.shape[-1]))


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
  np.testing.assert_allclose(got, combined(expected), rtol=0, atol=LOG_PROB)

  target_in = tf.constant([[BOS_ID, 5, 6], [BOS_ID, 7, PAD_ID]])
  np.testing.assert_allclose(
      ensemble((SOURCE, target_in)),
      combined([tf.nn.log_softmax(m((SOURCE, target_in))).numpy()
                for m in members]), rtol=0, atol=LOG_PROB)
  # A beam search over both runs, with sentences leaving the batch.
  ids, scores = _decode(ensemble, "beam")
  assert ids.shape[:2] == (2, 4) and np.all(np.isfinite(scores))


def test_one_pass_gives_the_logits_and_the_attention_of_two():
  """`logits_and_attention` (the export's forced alignment) of a model, an
  ensemble of members of one shape (attention averaged) and one of other
  shapes (the lead's attention): the teacher-forced call's logits and
  `attention_weights`' distributions, within float32 rounding."""
  target_in = tf.constant([[BOS_ID, 5, 6, 9], [BOS_ID, 7, PAD_ID, PAD_ID]])
  small = "num_layers=1,d_model=32,num_heads=2,d_k=16,d_v=16,d_ff=64"
  for model in (_model(1), Ensemble([_model(1), _model(2)]),
                Ensemble([_model(1), _model(2, small)], "probs")):
    logits, attention = model.logits_and_attention(SOURCE, target_in)
    np.testing.assert_allclose(logits, model((SOURCE, target_in)),
                               rtol=0, atol=LOG_PROB)
    expected = model.attention_weights(SOURCE, target_in)
    assert set(attention) == set(expected) == {
        "encoder_self", "decoder_self", "encoder_decoder"}
    for kind, layers in expected.items():
      assert len(attention[kind]) == len(layers) == 2  # the lead's depth
      for got, want in zip(attention[kind], layers):
        np.testing.assert_allclose(got, want, rtol=0, atol=ATTENTION)


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
  longest = max(map(len, sources)) + offset  # the search's limit
  for line in set(range(len(TEXTS))) - set(apart):
    assert [t for t, _ in ensemble[line]] == [t for t, _ in single[line]]
    np.testing.assert_allclose([s for _, s in ensemble[line]],
                               [s for _, s in single[line]], rtol=0,
                               atol=sentence(longest))
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
