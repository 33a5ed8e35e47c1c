"""The suite's rounding bound (tests/rounding.py): its float64 reference
computes the model's function, the model's float32 and half-precision
computations fall within the bound of it, the bound is tight enough to
catch what the comparisons look for, and the one fact about the kernels it
rests on holds on this host's."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_transformer import build_model, get_config
from tf_transformer.model import with_dtype_policy
from tf_transformer.special_ids import BOS_ID, EOS_ID
import rounding

pytestmark = pytest.mark.numeric

RNG = np.random.default_rng(0)
SOURCES = [list(RNG.integers(4, 50, size=n)) + [EOS_ID] for n in (3, 8, 5)]
TARGETS = [list(RNG.integers(4, 50, size=n)) + [EOS_ID] for n in (6, 2, 4)]


def _log_probs(model, sources, targets):
  """The Keras model's teacher-forced log-probabilities of each target
  token [rows, T], PAD columns 0."""
  source = rounding._padded(sources)  # pylint: disable=protected-access
  target_in = rounding._padded([[BOS_ID] + t[:-1] for t in targets])  # pylint: disable=protected-access
  target_out = rounding._padded(targets, target_in.shape[1])  # pylint: disable=protected-access
  log_probs = tf.nn.log_softmax(model((source, target_in)))
  return tf.gather(log_probs, target_out, batch_dims=2).numpy() * (
      target_out != 0)


OPTIONS = [
    "", "norm_position=pre",
    "activation=gelu,positional_encoding=learned",
    "activation=swish,positional_encoding=sinusoidal_halves,"
    "decoder_start=zero,output_bias=true",
    "activation=gelu_tanh,positional_encoding=sinusoidal_opennmt,"
    "share_embeddings=false,num_encoder_layers=3,num_decoder_layers=1",
    "d_model=48,num_heads=3,d_ff=96"]
POLICIES = ["float32", "mixed_float16",
            pytest.param("mixed_bfloat16", marks=pytest.mark.bfloat16)]


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("overrides", OPTIONS)
def test_the_model_computes_the_references_function(overrides, policy):
  """Each option of the model, in float32 and both half precisions, within
  its bound of the float64 reference: a reference that computed another
  function (a missing scale, a layer norm's epsilon, a position's offset)
  would be off by far more than rounding."""
  keras.utils.set_random_seed(1)
  model = build_model(get_config("tiny", ",".join(
      filter(None, ["vocab_size=50", overrides]))))
  precision = rounding.Precision(policy.replace("mixed_", ""))
  values, bound = rounding.token_bounds(model, SOURCES, TARGETS, precision)
  got = _log_probs(with_dtype_policy(model, policy), SOURCES, TARGETS)
  rounding.assert_within(got, values[:, :-1], bound[:, :-1], policy)
  rounding.assert_within(got.sum(1), values[:, -1], bound[:, -1], policy)


def test_the_trained_model_within_its_bound_and_a_bug_outside(
    trained_numbers_run):
  """On the suite's trained model: the Keras model's log-probabilities
  within the float32 bound (which is at most 2e-4 here, where float32
  logits of magnitude 10 round by 6e-7), and what the comparisons are there
  to catch outside it: reading each sentence one position off, or a model
  one of whose weight matrices is scaled by 1.01."""
  from tf_transformer.data import numbers  # pylint: disable=g-import-not-at-top
  from tf_transformer.run import run_dir  # pylint: disable=g-import-not-at-top
  model, vocab = run_dir.load_trained_model(str(trained_numbers_run))
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  processor = spm.SentencePieceProcessor(model_proto=vocab.model_proto)
  pairs = numbers.generate({"test": 16}, seed=3)["test"]
  sources = [processor.encode(s) + [EOS_ID] for s, _ in pairs]
  targets = [processor.encode(t) + [EOS_ID] for _, t in pairs]
  values, bound = rounding.token_bounds(model, sources, targets)
  got = _log_probs(model, sources, targets)
  real = got != 0
  rounding.assert_within(got, values[:, :-1], bound[:, :-1])
  assert bound[:, :-1][real].max() < 2e-4
  shifted = np.abs(got[:, 1:] - values[:, :-2])[real[:, 1:]]
  assert np.mean(shifted > 2 * bound[:, :-2][real[:, 1:]]) > 0.95
  kernel = model.decoder.decoder_layers[0].feed_forward.outer.kernel
  kernel.assign(kernel * 1.01)
  moved = np.abs(_log_probs(model, sources, targets) - values[:, :-1])
  assert np.mean(moved[real] > 2 * bound[:, :-1][real]) > 0.5


@pytest.mark.parametrize("dtype,terms", [
    ("float16", 4096), pytest.param("bfloat16", 1024,
                                    marks=pytest.mark.bfloat16)])
def test_half_precision_matmuls_sum_in_float32(dtype, terms):
  """The bound takes a half-precision MatMul (the model's projections and
  logits) to add its products in float32, as oneDNN's and Eigen's kernels
  do: n ones sum to n, which a sum kept in the half dtype stops short of
  (2,048 in float16, 256 in bfloat16, where adding 1 no longer moves it).
  Attention's einsums are bounded as if they summed in the half dtype
  (Eigen's bfloat16 contraction does, in part)."""
  ones = lambda *shape: tf.ones(shape, dtype)
  assert float(tf.matmul(ones(3, terms), ones(terms, 2))[0, 0]) == terms
  assert float(tf.matmul(ones(2, 3, terms), ones(2, terms, 2))[0, 0, 0]) == (
      terms)
