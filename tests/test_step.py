"""The one decoding step (decoding/step.py): at every position, its logits
are what a teacher-forced pass (`Transformer.call`) gives each row's own
history, whatever the decoder (post- or pre-norm, learned positions,
separate embeddings, heads of other sizes), the dtype, and eager, graph or
XLA; and the searches built on it score every hypothesis as teacher forcing
does, for one model and an ensemble. Then how it runs: in place, weights
read before the loop, fused matmuls."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_transformer import build_model, get_config
from tf_transformer.decoding import beam_search
from tf_transformer.decoding import search
from tf_transformer.decoding.cache import BLOCK_LENGTH
from tf_transformer.decoding.ensemble import Ensemble
from tf_transformer.decoding.step import Step
from tf_transformer.special_ids import BOS_ID, EOS_ID, PAD_ID
import rounding

SOURCE = tf.constant([[5, 6, 7, EOS_ID], [8, EOS_ID, PAD_ID, PAD_ID]])
STEPS = BLOCK_LENGTH + 3  # two blocks

pytestmark = pytest.mark.numeric


def _model(overrides="", dtype=None, seed=3):
  keras.utils.set_random_seed(seed)
  config = get_config("tiny", ",".join(
      o for o in ("vocab_size=40,dropout_rate=0.0", overrides) if o))
  model = build_model(config, dtype)
  # Trained-like normalizations: the step folds their betas and gains into
  # the matmuls after them, which ones and zeros would not test.
  rng = np.random.default_rng(4)
  for variable in model.weights:
    if variable.path.endswith(("/gamma", "/beta")):
      low = 0.5 if variable.path.endswith("/gamma") else -0.5
      variable.assign(rng.uniform(low, low + 1.0, variable.shape))
    if variable.path.endswith("output_bias"):
      variable.assign(rng.normal(0.0, 1.0, variable.shape))
  return model


# The quick tier keeps the plain model in each mode and dtype; the options'
# cases (published models' and students' shapes: the step's structure, the
# same kernels) cost 0.7 of this file's time and go to the slow tier.
_SLOW = pytest.mark.slow
_BF16 = pytest.mark.bfloat16


@pytest.mark.parametrize("overrides,group,mode,dtype", [
    ("", 3, "graph", "float32"), ("", 1, "xla", "float32"),
    ("", 2, "eager", "float32"),
    pytest.param("", 2, "graph", "bfloat16", marks=_BF16),
    pytest.param("norm_position=pre", 3, "xla", "float32", marks=_SLOW),
    pytest.param("norm_position=pre,positional_encoding=learned", 2, "graph",
                 "float32", marks=_SLOW),
    pytest.param("share_embeddings=false,d_k=8,d_v=24", 2, "graph",
                 "float32", marks=_SLOW),
    pytest.param("norm_position=pre", 2, "eager", "bfloat16",
                 marks=[_BF16, _SLOW]),
    # Marian's options (interop/marian.py).
    pytest.param("activation=swish,positional_encoding=sinusoidal_halves,"
                 "decoder_start=zero,output_bias=true", 2, "graph", "float32",
                 marks=_SLOW),
    pytest.param("activation=gelu,decoder_start=zero,output_bias=true", 3,
                 "xla", "float32", marks=_SLOW),
    pytest.param("activation=swish,positional_encoding=sinusoidal_halves,"
                 "output_bias=true", 2, "eager", "bfloat16",
                 marks=[_BF16, _SLOW]),
    # OpenNMT-tf's (interop/opennmt_tf.py).
    pytest.param("norm_position=pre,activation=gelu_tanh,"
                 "layer_norm_epsilon=0.001,positional_encoding="
                 "sinusoidal_opennmt,output_bias=true", 2, "xla", "float32",
                 marks=_SLOW),
    # A student's deep encoder and shallow decoder.
    pytest.param("num_encoder_layers=3,num_decoder_layers=1", 3, "graph",
                 "float32", marks=_SLOW),
    pytest.param("num_encoder_layers=3,num_decoder_layers=1", 2, "xla",
                 "float32", marks=_SLOW)])
def test_each_position_equals_teacher_forcing(overrides, group, mode, dtype):
  """Every step, each row's logits equal a teacher-forced pass over its own
  history, while rows take over other slots' hypotheses as in a beam
  search, across a block boundary."""
  model = _model(overrides, dtype)
  step = Step(model, static=mode == "xla")
  weights = step.prepare(STEPS)
  memory, source_mask = step.encode(SOURCE, weights)
  cache = step.initial_cache(weights, memory, STEPS, group)
  call = lambda ids, position, cache: step(ids, position, cache, source_mask,
                                           weights)
  if mode != "eager":
    call = tf.function(call, jit_compile=mode == "xla")
  rows = tf.repeat(SOURCE, group, axis=0)
  histories = [[BOS_ID] for _ in range(rows.shape[0])]
  rng = np.random.default_rng(0)
  steps, fulls, seen = [], [], []
  for position in range(STEPS):
    ids = tf.constant([[h[-1]] for h in histories], tf.int32)
    logits, cache = call(ids, tf.constant(position), cache)
    assert logits.dtype == tf.float32
    full = model((rows, tf.constant(histories, tf.int32)))[:, -1]
    steps.append(logits.numpy())
    fulls.append(full.numpy())
    seen += [h[1:] for h in histories]
    parents = rng.integers(0, group, [SOURCE.shape[0], group])
    cache = step.reorder(cache, tf.constant(parents, tf.int32))
    histories = [histories[b * group + parents[b, j]] +
                 [int(rng.integers(3, 40))]
                 for b in range(SOURCE.shape[0]) for j in range(group)]
  # Two paths computing in `dtype` (the step, teacher forcing), each logit
  # within their bounds of the exact one (rounding.py).
  sources = rounding.unpadded(rows) * STEPS
  _, bound = rounding.logit_bounds(model, sources, seen,
                                   rounding.Precision(dtype))
  rounding.assert_within(np.concatenate(steps), np.concatenate(fulls),
                         2 * bound, f"{overrides} {mode} {dtype}")
  if mode == "xla":  # every shape static: one program
    assert call.experimental_get_tracing_count() == 1
  elif mode == "graph":  # one trace per buffer size: 0, 1 and 2 blocks
    assert call.experimental_get_tracing_count() == 3


def _teacher_forced(model, source, output):
  """log P(output | source) under teacher forcing (output ending in EOS,
  or cut at its limit), the ensemble's combined distribution renormalized
  as its search renormalizes it."""
  decoder_in = tf.constant([[BOS_ID] + output[:-1]], tf.int32)
  log_probs = tf.nn.log_softmax(model((source[tf.newaxis], decoder_in)))
  return float(tf.reduce_sum(tf.gather(log_probs[0], output, batch_dims=1)))


@pytest.mark.parametrize("method", ["beam", "greedy"])
@pytest.mark.parametrize("members", [1, 2])
def test_searches_score_what_teacher_forcing_gives(method, members):
  """Each hypothesis of beam search or greedy decoding, of one model or an
  ensemble of two, scores log P(Y|X) / lp(Y) of a teacher-forced pass."""
  models = [_model(seed=seed) for seed in range(3, 3 + members)]
  model = models[0] if members == 1 else Ensemble(models)
  options = search.DecodingOptions(method=method, max_decode_length_offset=6)
  ids, scores = search.decode(model, SOURCE, options)
  # The cached step and teacher forcing: two paths, each within its float32
  # bound (rounding.py).
  bound = 2 * rounding.search_bounds(model, rounding.unpadded(SOURCE), ids)
  for row in range(SOURCE.shape[0]):
    source = tf.boolean_mask(SOURCE[row], SOURCE[row] != PAD_ID)
    for rank in range(options.nbest):
      output = [int(t) for t in ids[row, rank].numpy() if t != PAD_ID]
      penalty = beam_search.length_penalty(len(output), 0.6)
      rounding.assert_within(
          scores[row, rank],
          _teacher_forced(model, source, output) / float(penalty),
          bound[row, rank], f"row {row}, rank {rank}")


def test_a_step_writes_its_position_in_place():
  """No step copies the cache but the one that starts a block: the buffer a
  step is given is the one it returns, now holding the new position (so an
  old cache must not be reused), and holds the blocks filled so far; the
  memory's keys are once per sentence, shared by its hypotheses."""
  step = Step(_model())
  weights = step.prepare(STEPS)
  memory, source_mask = step.encode(SOURCE, weights)
  cache = step.initial_cache(weights, memory, STEPS, group_size=4)
  assert cache["layer_0"]["memory_key"].shape[0] == SOURCE.shape[0]
  assert cache["ancestors"].shape == (SOURCE.shape[0], 4, 2 * BLOCK_LENGTH)
  assert cache["layer_0"]["key"].shape[0] == 0  # no block yet
  ids = tf.fill([SOURCE.shape[0] * 4, 1], BOS_ID)
  blocks = []
  for position in range(BLOCK_LENGTH + 1):
    given = cache["layer_0"]["key"]
    _, cache = step(ids, tf.constant(position), cache, source_mask, weights)
    returned = cache["layer_0"]["key"]
    blocks.append(returned.shape[0])
    if position % BLOCK_LENGTH:
      np.testing.assert_array_equal(given.numpy(), returned.numpy())
    # The new position is written; the ones after it are still zeros.
    rows = returned.numpy()[position // BLOCK_LENGTH].reshape(
        [SOURCE.shape[0], -1, BLOCK_LENGTH, 4 * returned.shape[-1]])
    assert np.abs(rows[:, :, position % BLOCK_LENGTH]).sum() > 0
    assert not rows[:, :, position % BLOCK_LENGTH + 1:].any()
  assert blocks == [1] * BLOCK_LENGTH + [2]


def test_no_variable_is_read_inside_the_search_loop():
  """The traced search reads the step's weights before its loop: no
  ReadVariableOp in the loop body, and the projections are 2-D MatMul +
  BiasAdd pairs that Grappler can fuse (no BatchMatMulV2 but attention's)."""
  model = _model()
  stored = tf.nest.map_structure(
      lambda w: None if w is None else tf.Variable(w), Step(model).prepare(16))
  traced = tf.function(lambda s: search.decode(
      model, s, search.DecodingOptions(max_decode_length_offset=8),
      step_weights=stored)).get_concrete_function(
          tf.TensorSpec([None, None], tf.int32))
  bodies = [f for f in traced.graph.as_graph_def().library.function
            if "while_body" in f.signature.name]
  body = max(bodies, key=lambda f: len(f.node_def))
  ops = [node.op for node in body.node_def]
  assert "ReadVariableOp" not in ops
  layers = model.config.model.num_layers
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
  weights = Step(model).prepare(4)
  gains = [[layer.self_gamma, layer.cross_gamma, layer.feed_forward_gamma]
           for layer in weights.layers]
  kept = [[gain is not None for gain in layer] for layer in gains]
  if norm_position == "pre":
    assert kept == [[False] * 3] * len(gains)
  else:
    assert kept == [[True] * 3] * (len(gains) - 1) + [[True, True, False]]
  named = model.named_weights()
  norm = (named.decoder.final_norm if norm_position == "pre" else
          named.decoder.layers[-1].feed_forward_norm)
  # One product of two float32 numbers each side: both correctly rounded.
  np.testing.assert_array_equal(
      weights.output_kernel,
      norm.gamma.numpy()[:, None] * named.output_embedding.numpy().T)
