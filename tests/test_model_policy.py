"""The Transformer under its own Keras dtype policy (`dtype=`, not the global
one): every layer computes in it, the logits stay float32, it trains, it
saves, and a bfloat16 or float16 copy of a trained model gives the float32
model's log-probabilities and translations within half precision's
rounding."""

import keras
import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf

from tf_transformer import build_model, get_config
from tf_transformer.model import with_dtype_policy
from tf_transformer.data import numbers
from tf_transformer.decoding.search import DecodingOptions, decode
from tf_transformer.run import run_dir
from tf_transformer.special_ids import BOS_ID, EOS_ID, PAD_ID
from tf_transformer.training.loss import LabelSmoothedCrossEntropy
import rounding
import search_reference
from training_helpers import copy_task, token_log_probs

SOURCES, REFERENCES = zip(*numbers.generate({"test": 64}, seed=7)["test"])


def _model(policy, overrides="vocab_size=20,num_layers=1"):
  return build_model(get_config("tiny", overrides), policy)


@pytest.mark.parametrize("policy", [
    pytest.param("mixed_bfloat16", marks=pytest.mark.bfloat16),
    "mixed_float16", pytest.param("bfloat16", marks=pytest.mark.bfloat16)])
def test_policy_reaches_every_layer_and_logits_are_float32(policy):
  model = _model(policy, "vocab_size=20,norm_position=pre,"
                 "positional_encoding=learned,share_embeddings=False")
  policy = keras.DTypePolicy(policy)
  for layer in model._flatten_layers():  # pylint: disable=protected-access
    assert layer.dtype_policy.name == policy.name, layer.path
  assert {w.dtype for w in model.weights} == {policy.variable_dtype}
  source = tf.constant([[5, 6, EOS_ID, 0]])
  target_in = tf.constant([[BOS_ID, 7, 8]])
  memory, _ = model.encode(source)
  assert memory.dtype == policy.compute_dtype
  assert model((source, target_in)).dtype == tf.float32


@pytest.mark.bfloat16
def test_mixed_bfloat16_model_trains_under_model_fit_and_saves(tmp_path):
  model = _model("mixed_bfloat16")
  model.compile(optimizer=keras.optimizers.Adam(3e-3),
                loss=LabelSmoothedCrossEntropy(0.1))
  losses = model.fit(copy_task(), epochs=6, verbose=0).history["loss"]
  # A coarse property of training: over seeds 0-7 the last epoch's loss
  # was 0.62-0.70 of the first's on AVX512_BF16's kernels and Eigen's (AMD
  # Zen 4), so the bar is 0.8.
  assert losses[-1] < 0.8 * losses[0], losses
  path = str(tmp_path / "bf16.keras")
  model.save(path)
  loaded = keras.models.load_model(path, safe_mode=True)
  assert loaded.dtype_policy.name == "mixed_bfloat16"
  assert loaded.decoder.decoder_layers[0].feed_forward.compute_dtype == (
      "bfloat16")
  batch = next(iter(copy_task()))[0]
  np.testing.assert_array_equal(loaded(batch), model(batch))


POLICIES = ["mixed_float16",
            pytest.param("mixed_bfloat16", marks=pytest.mark.bfloat16)]


@pytest.mark.numeric
@pytest.mark.parametrize("policy", POLICIES)
def test_half_precision_copy_gives_the_float32_log_probabilities(
    trained_numbers_run, policy):
  """Each token's log-probability, from the float32 model and from its
  half-precision copy, within each one's rounding bound of the exact value
  (rounding.py: float32, or the half dtype's weights and activations with
  float32 softmaxes and layer norms)."""
  model, vocab = run_dir.load_trained_model(str(trained_numbers_run))
  processor = spm.SentencePieceProcessor(model_proto=vocab.model_proto)
  full = token_log_probs(model, processor, SOURCES, REFERENCES)
  half = token_log_probs(with_dtype_policy(model, policy), processor,
                         SOURCES, REFERENCES)
  encode = lambda texts: [ids + [EOS_ID] for ids in processor.encode(
      list(texts))]
  sources, targets = encode(SOURCES), encode(REFERENCES)
  _, full_bound = rounding.token_bounds(model, sources, targets)
  _, half_bound = rounding.token_bounds(
      model, sources, targets, rounding.Precision(policy.split("_")[1]))
  for row, (a, b) in enumerate(zip(full, half)):
    n = len(a)
    rounding.assert_within(b, a, full_bound[row, :n] + half_bound[row, :n],
                           f"{policy}, line {row}")
    rounding.assert_within(b.sum(), a.sum(),
                           full_bound[row, -1] + half_bound[row, -1])


@pytest.mark.numeric
@pytest.mark.bfloat16
def test_bfloat16_copy_searches_in_float32(trained_numbers_run):
  model, vocab = run_dir.load_trained_model(str(trained_numbers_run))
  processor = spm.SentencePieceProcessor(model_proto=vocab.model_proto)
  source = tf.ragged.constant(
      [ids + [EOS_ID] for ids in processor.encode(list(SOURCES))]).to_tensor()
  ids, scores = decode(model, source, DecodingOptions())
  half_ids, half_scores = decode(with_dtype_policy(model, "mixed_bfloat16"),
                                 source, DecodingOptions())
  assert half_scores.dtype == tf.float32
  # Apart only where a decision of the search lies within both models'
  # rounding (float32's, and bfloat16's weights and activations).
  precisions = (rounding.FLOAT32, rounding.Precision("bfloat16"))
  sources = [_strip(row) for row in source.numpy()]
  best = lambda ids: [_strip(row[0], EOS_ID) for row in ids.numpy()]
  full, half = best(ids), best(half_ids)
  apart = [line for line, (a, b) in enumerate(zip(full, half)) if a != b]
  search_reference.assert_near_ties(
      model, sources, apart, why=lambda line: f"{full[line]}, {half[line]}",
      precisions=precisions)
  same = [line not in apart for line in range(len(full))]
  outputs = [_strip(row[0]) for row in ids.numpy()]
  bound = sum(rounding.output_bounds(model, sources, outputs, precision)
              for precision in precisions)
  rounding.assert_within(half_scores.numpy()[:, 0][same],
                         scores.numpy()[:, 0][same], bound[same])


def _strip(ids, *also):
  """The ids of a row without PAD (and `also`)."""
  return [int(t) for t in ids if t != PAD_ID and t not in also]
