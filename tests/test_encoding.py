"""The search's encoder on the real tokens only (decoding/encoding.py): at
every real position its memory is what the Keras layers
(`Transformer.encode`) compute, whatever the encoder (post- or pre-norm,
learned or half-split positions, heads of other sizes, Marian's
activations), the dtype, eager or traced with unknown shapes; zero at
padding, which no attention reads."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_transformer import build_model, get_config
from tf_transformer.decoding import encoding
from tf_transformer.decoding import step_weights
from tf_transformer.decoding.step import Step
from tf_transformer.special_ids import EOS_ID, PAD_ID
import rounding

pytestmark = pytest.mark.numeric

# Lengths 5, 2, 1 and 4: padding in every sentence but the first.
SOURCE = tf.constant([[5, 6, 7, 9, EOS_ID], [8, EOS_ID, PAD_ID, PAD_ID, PAD_ID],
                      [EOS_ID, PAD_ID, PAD_ID, PAD_ID, PAD_ID],
                      [11, 12, 13, EOS_ID, PAD_ID]])


def _model(overrides, dtype):
  keras.utils.set_random_seed(5)
  config = get_config("tiny", ",".join(
      o for o in ("vocab_size=40,dropout_rate=0.0", overrides) if o))
  model = build_model(config, dtype)
  rng = np.random.default_rng(6)  # trained-like normalizations and biases
  for variable in model.weights:
    if variable.path.endswith(("/gamma", "/beta", "/bias")):
      low = 0.5 if variable.path.endswith("/gamma") else -0.5
      variable.assign(rng.uniform(low, low + 1.0, variable.shape))
  return model


@pytest.mark.parametrize("overrides,dtype,mode", [
    ("", "float32", "eager"), ("", "float32", "graph"),
    ("norm_position=pre", "float32", "graph"),
    ("norm_position=pre,positional_encoding=learned", "float32", "eager"),
    ("share_embeddings=false,d_k=8,d_v=24", "float32", "graph"),
    ("activation=swish,positional_encoding=sinusoidal_halves", "float32",
     "graph"),
    ("activation=gelu", "float32", "eager"),
    ("norm_position=pre,activation=gelu_tanh,"
     "positional_encoding=sinusoidal_opennmt", "float32", "graph"),
    pytest.param("", "bfloat16", "graph", marks=pytest.mark.bfloat16),
    pytest.param("norm_position=pre", "bfloat16", "eager",
                 marks=pytest.mark.bfloat16)])
def test_memory_equals_the_keras_encoder_at_real_tokens(overrides, dtype,
                                                        mode):
  model = _model(overrides, dtype)
  step = Step(model)
  weights = step.prepare(8)
  expected, expected_mask = model.encode(SOURCE)
  encode = lambda ids: step.encode(ids, weights)
  if mode == "graph":  # every size unknown, as in an export
    encode = tf.function(encode, input_signature=[
        tf.TensorSpec([None, None], tf.int32)])
  memory, mask = encode(SOURCE)
  np.testing.assert_array_equal(mask, expected_mask)
  assert memory.dtype == expected.dtype and memory.shape == expected.shape
  real = mask.numpy()
  memory = tf.cast(memory, tf.float32).numpy()
  expected = tf.cast(expected, tf.float32).numpy()
  # Two paths (the step's fused Q, K and V, the Keras layers), each within
  # its bound (rounding.py) in `dtype`.
  _, bound = rounding.memory_bounds(model, rounding.unpadded(SOURCE),
                                    rounding.Precision(dtype))
  rounding.assert_within(memory[real], expected[real], 2 * bound[real])
  assert not memory[~real].any()


def test_without_prepared_weights_and_under_xla_the_keras_layers_encode():
  """`Step.encode` without weights, or static (XLA: no shape may depend on
  the values), is `Transformer.encode`, padding included."""
  model = _model("", "float32")
  expected, _ = model.encode(SOURCE)
  weights = Step(model).prepare(8)
  for memory, _ in (Step(model).encode(SOURCE),
                    Step(model, static=True).encode(SOURCE, weights)):
    np.testing.assert_array_equal(memory, expected)


def test_the_prepared_weights_are_the_layers():
  """W^Q scaled by 1 / sqrt(d_k) beside W^K and W^V; the feed-forward's
  real units unchanged."""
  model = _model("d_k=8,d_v=24", "float32")
  named = model.named_weights()
  weights = encoding.prepare(named, "float32")
  attention = named.encoder.layers[0].self_attention
  layer = weights.layers[0]
  d_q = attention.query.kernel.shape[-1]
  # Three roundings apart at most: the scale's, the product's, NumPy's
  # quotient's.
  np.testing.assert_allclose(layer.qkv_kernel[:, :d_q],
                             attention.query.kernel.numpy() / np.sqrt(8),
                             rtol=3 * rounding.U32)
  np.testing.assert_array_equal(layer.qkv_kernel[:, d_q:2 * d_q],
                                attention.key.kernel)
  inner = named.encoder.layers[0].feed_forward.inner.kernel
  np.testing.assert_array_equal(layer.inner_kernel[:, :inner.shape[-1]],
                                inner)
  assert len(weights.layers) == len(named.encoder.layers)


def test_an_xla_search_keeps_no_copy_of_the_encoder():
  """XLA's search encodes with the Keras layers: its export drops the
  prepared encoder (`without_encoder`), for one model and an ensemble's
  tuple, and keeps the rest."""
  weights = Step(_model("", "float32")).prepare(8)
  assert weights.encoder is not None
  for given in (weights, (weights, weights)):
    kept = step_weights.without_encoder(given)
    for w in (kept,) if given is weights else kept:
      assert w.encoder is None and w.layers is weights.layers
