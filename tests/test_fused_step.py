"""The fused decoding step computes what the Keras layers' cached step
computes, from the same weights, for every kind of decoder; it runs fused
kernels and reads no variable inside the search's loop."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_transformer import build_model, get_config
from tf_transformer.decoding import beam_search
from tf_transformer.decoding import search
from tf_transformer.layers import fused_step
from tf_transformer.layers.decoding_cache import BLOCK_LENGTH
from tf_transformer.special_ids import BOS_ID, EOS_ID, PAD_ID

SOURCE = tf.constant([[5, 6, 7, EOS_ID], [8, EOS_ID, PAD_ID, PAD_ID]])
STEPS = BLOCK_LENGTH + 3  # two blocks


def _model(overrides=""):
  keras.utils.set_random_seed(3)
  config = get_config("tiny", ",".join(
      o for o in ("vocab_size=40,dropout_rate=0.0", overrides) if o))
  model = build_model(config)
  model.set_xla_attention(False)
  # Trained-like normalizations: the step folds their betas and gains into
  # the matmuls after them, which ones and zeros would not test.
  rng = np.random.default_rng(4)
  for variable in model.weights:
    if variable.path.endswith(("/gamma", "/beta")):
      low = 0.5 if variable.path.endswith("/gamma") else -0.5
      variable.assign(rng.uniform(low, low + 1.0, variable.shape))
  return model


@pytest.mark.parametrize("overrides,group,mode", [
    ("", 3, "graph"), ("", 1, "xla"),
    ("norm_position=pre,positional_encoding=learned", 2, "graph"),
    ("share_embeddings=false,d_k=8,d_v=24", 2, "graph")])
def test_fused_step_equals_the_keras_step(overrides, group, mode):
  """Logits at every step, hypotheses moving between slots, across a block
  boundary: the fused step and `Transformer.decode` with a cache agree."""
  model = _model(overrides)
  memory, source_mask = model.encode(SOURCE)
  weights = fused_step.prepare(model, STEPS)
  shape = fused_step.shape_of(model)
  keras_cache = model.initial_cache(memory, STEPS, group)
  fused_cache = model.initial_cache(memory, STEPS, group)

  @tf.function(jit_compile=(mode == "xla"))
  def steps(ids, step, keras_cache, fused_cache, parents):
    keras_logits, keras_cache, _ = model.cached_step(ids, step, keras_cache,
                                                     source_mask)
    fused_logits, fused_cache = fused_step.decoder_step(
        weights, shape, ids, step, fused_cache, source_mask)
    reorder = model.decoder.reorder_cache
    return (keras_logits[:, 0], fused_logits, reorder(keras_cache, parents),
            reorder(fused_cache, parents))

  rng = np.random.default_rng(0)
  rows = SOURCE.shape[0] * group
  ids = tf.fill([rows, 1], BOS_ID)
  for step in range(STEPS):
    parents = tf.constant(rng.integers(0, group, [SOURCE.shape[0], group]),
                          tf.int32)
    expected, got, keras_cache, fused_cache = steps(
        ids, tf.constant(step), keras_cache, fused_cache, parents)
    np.testing.assert_allclose(got, expected, atol=2e-5,
                               err_msg=f"step {step}")
    ids = tf.constant(rng.integers(4, 40, [rows, 1]), tf.int32)


def test_fused_step_in_bfloat16_follows_the_policy():
  """Under the "bfloat16" policy the step multiplies in bfloat16 and
  normalizes in float32, as the layers do: the same logits to bfloat16's
  rounding."""
  model = build_model(get_config("tiny", "vocab_size=40,dropout_rate=0.0"),
                      dtype="bfloat16")
  model.set_xla_attention(False)
  memory, source_mask = model.encode(SOURCE)
  weights = fused_step.prepare(model, 4)
  assert weights.layers[0].qkv_kernel.dtype == tf.bfloat16
  ids = tf.fill([2, 1], BOS_ID)
  expected, _, _ = model.cached_step(ids, 0, model.initial_cache(memory, 4),
                                     source_mask)
  got, _ = fused_step.decoder_step(weights, fused_step.shape_of(model), ids,
                                   tf.constant(0), model.initial_cache(memory, 4),
                                   source_mask)
  assert got.dtype == tf.float32
  np.testing.assert_allclose(got, expected[:, 0], atol=0.1)


def test_beam_search_over_either_step_finds_the_same_translations():
  """The search runs the fused step; run over the Keras layers' step
  instead, it finds the same hypotheses with the same scores."""
  model = _model()
  source = tf.constant([[5, 6, 7, 8, 9, EOS_ID], [8, 9, EOS_ID] + [PAD_ID] * 3])
  fused_ids, fused_scores = search.model_beam_search(model, source,
                                                     max_length_offset=8)
  memory, source_mask = model.encode(source)
  cache = model.initial_cache(memory, 14, group_size=4)

  def keras_step(ids, step, cache):
    return model.cached_step(ids, step, cache, source_mask)[:2]

  limits = tf.reduce_sum(tf.cast(source_mask, tf.int32), 1) + 8
  ids, scores = beam_search.beam_search(
      keras_step, cache, 2, limits, 14, beam_size=4,
      reorder_cache=lambda c, parents: model.decoder.reorder_cache(c, parents))
  np.testing.assert_array_equal(fused_ids, ids[:, :, :fused_ids.shape[2]])
  np.testing.assert_allclose(fused_scores, scores, atol=1e-5)


def test_no_variable_is_read_inside_the_search_loop():
  """The traced search reads the step's weights before its loop: no
  ReadVariableOp in the loop body, and the projections are 2-D MatMul +
  BiasAdd pairs that Grappler can fuse (no BatchMatMulV2 but attention's)."""
  model = _model()
  stored = tf.nest.map_structure(lambda w: None if w is None else tf.Variable(w),
                                 model.step_weights(16))
  traced = tf.function(lambda s: search.model_beam_search(
      model, s, max_length_offset=8, step_weights=stored)).get_concrete_function(
          tf.TensorSpec([None, None], tf.int32))
  bodies = [f for f in traced.graph.as_graph_def().library.function
            if "while_body" in f.signature.name]
  body = max(bodies, key=lambda f: len(f.node_def))
  ops = [node.op for node in body.node_def]
  assert "ReadVariableOp" not in ops
  layers = len(model.decoder.decoder_layers)
  # Per layer: QKV, self W^O, cross W^Q, cross W^O, W_1, W_2; and the
  # output projection, whose bias is the last LayerNorm's beta (folded).
  assert ops.count("BiasAdd") == 6 * layers + 1
  # Per layer: two per attention (scores, weighted values).
  assert ops.count("BatchMatMulV2") == 4 * layers


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_gains_the_matmuls_take(norm_position):
  """A normalization whose output feeds matmuls only leaves its gain to
  them (pre-norm: every one, and the final norm's to the output kernel;
  post-norm: the last layer's last); the others keep theirs."""
  model = _model(f"norm_position={norm_position}")
  weights = fused_step.prepare(model, 4)
  gains = [[layer.self_gamma, layer.cross_gamma, layer.feed_forward_gamma]
           for layer in weights.layers]
  kept = [[gain is not None for gain in layer] for layer in gains]
  if norm_position == "pre":
    assert kept == [[False] * 3] * len(gains)
  else:
    assert kept == [[True] * 3] * (len(gains) - 1) + [[True, True, False]]
  norm = (model.decoder.final_norm if norm_position == "pre" else
          model.decoder.decoder_layers[-1].feed_forward_residual.layer_norm)
  np.testing.assert_allclose(
      weights.output_kernel,
      norm.gamma.numpy()[:, None] * model.output_embedding.transposed(),
      rtol=1e-6)
