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
import search_reference
from training_helpers import copy_task, token_log_probs

SOURCES, REFERENCES = zip(*numbers.generate({"test": 64}, seed=7)["test"])


def _model(policy, overrides="vocab_size=20,num_layers=1"):
  return build_model(get_config("tiny", overrides), policy)


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16",
                                    "bfloat16"])
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


def test_mixed_bfloat16_model_trains_under_model_fit_and_saves(tmp_path):
  model = _model("mixed_bfloat16")
  model.compile(optimizer=keras.optimizers.Adam(3e-3),
                loss=LabelSmoothedCrossEntropy(0.1))
  losses = model.fit(copy_task(), epochs=6, verbose=0).history["loss"]
  assert losses[-1] < 0.7 * losses[0], losses
  path = str(tmp_path / "bf16.keras")
  model.save(path)
  loaded = keras.models.load_model(path, safe_mode=True)
  assert loaded.dtype_policy.name == "mixed_bfloat16"
  assert loaded.decoder.decoder_layers[0].feed_forward.compute_dtype == (
      "bfloat16")
  batch = next(iter(copy_task()))[0]
  np.testing.assert_array_equal(loaded(batch), model(batch))


def _token_log_probs(model, processor):
  return np.concatenate(token_log_probs(model, processor, SOURCES,
                                        REFERENCES))


# Half precision's rounding, measured on the trained fixture (548 tokens):
# bfloat16 keeps 8 significant bits, so logits of magnitude ~10 round by
# 0.02-0.04 and a token's log-probability moves by 0.006 on average, 0.21 at
# most; float16 keeps 11 bits, 0.0007 and 0.011. On 9 numbers models
# (seeds 0-2, 200-400 steps, an AVX2 host) bfloat16's were 0.0074-0.0115
# and 0.13-0.28. The bounds leave a margin of 1.7 or more over those.
TOLERANCES = {"mixed_bfloat16": (0.02, 0.5), "mixed_float16": (0.002, 0.03)}


@pytest.mark.parametrize("policy", TOLERANCES)
def test_half_precision_copy_gives_the_float32_log_probabilities(
    trained_numbers_run, policy):
  model, vocab = run_dir.load_trained_model(str(trained_numbers_run))
  processor = spm.SentencePieceProcessor(model_proto=vocab.model_proto)
  full = _token_log_probs(model, processor)
  half = _token_log_probs(with_dtype_policy(model, policy), processor)
  gaps = np.abs(full - half)
  mean_bound, max_bound = TOLERANCES[policy]
  assert gaps.mean() < mean_bound and gaps.max() < max_bound, (
      gaps.mean(), gaps.max())


def test_bfloat16_copy_searches_in_float32(trained_numbers_run):
  model, vocab = run_dir.load_trained_model(str(trained_numbers_run))
  processor = spm.SentencePieceProcessor(model_proto=vocab.model_proto)
  source = tf.ragged.constant(
      [ids + [EOS_ID] for ids in processor.encode(list(SOURCES))]).to_tensor()
  ids, scores = decode(model, source, DecodingOptions())
  half_ids, half_scores = decode(with_dtype_policy(model, "mixed_bfloat16"),
                                 source, DecodingOptions())
  assert half_scores.dtype == tf.float32
  # Apart only where bfloat16's rounding, as measured along the line's two
  # outputs, can tip a decision of the search.
  sources = [_strip(row) for row in source.numpy()]
  best = lambda ids: [_strip(row[0], EOS_ID) for row in ids.numpy()]
  full, half = best(ids), best(half_ids)
  apart = [line for line, (a, b) in enumerate(zip(full, half)) if a != b]
  half_model = with_dtype_policy(model, "mixed_bfloat16")
  search_reference.assert_near_ties(
      model, sources, apart, why=lambda line: f"{full[line]}, {half[line]}",
      epsilon=lambda line: search_reference.rounding_between(
          model, half_model, sources[line], [full[line], half[line]]))
  same = [line not in apart for line in range(len(full))]
  gaps = np.abs(scores.numpy()[:, 0] - half_scores.numpy()[:, 0])[same]
  assert gaps.max() < TOLERANCES["mixed_bfloat16"][1], gaps.max()


def _strip(ids, *also):
  """The ids of a row without PAD (and `also`)."""
  return [int(t) for t in ids if t != PAD_ID and t not in also]
