"""The decoding cache: hypotheses that move between slots, outputs longer
than a block, in-place writes, and the same logits eagerly, in a graph and
under XLA."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_transformer import build_model, get_config
from tf_transformer.layers.decoding_cache import BLOCK_LENGTH
from tf_transformer.special_ids import BOS_ID, EOS_ID, PAD_ID

SOURCE = tf.constant([[5, 6, 7, EOS_ID], [8, EOS_ID, PAD_ID, PAD_ID]])
STEPS = BLOCK_LENGTH + 4  # two blocks


@pytest.fixture(scope="module")
def model():
  keras.utils.set_random_seed(7)
  return build_model(get_config("tiny", "vocab_size=50,dropout_rate=0.0"))


def _step_function(model, source_mask, mode):
  def step(ids, position, cache):
    return model.cached_step(ids, position, cache, source_mask)
  if mode == "eager":
    return step
  return tf.function(step, jit_compile=(mode == "xla"))


@pytest.mark.parametrize("mode,group_size", [
    ("graph", 1), ("graph", 3), ("xla", 1), ("xla", 3),
    ("eager", 3)])  # eager group 1: tests/test_model.py
def test_cached_steps_equal_teacher_forcing_as_beams_move(model, mode,
                                                          group_size):
  """Every step, each row's logits and self-attention weights equal a full
  decode of its own history, while rows take over other slots' hypotheses
  as in a beam search."""
  rng = np.random.default_rng(0)
  batch = SOURCE.shape[0]
  memory, source_mask = model.encode(SOURCE)
  row_memory = tf.repeat(memory, group_size, axis=0)
  row_mask = tf.repeat(source_mask, group_size, axis=0)
  histories = [[BOS_ID] for _ in range(batch * group_size)]
  cache = model.initial_cache(memory, STEPS, group_size)
  step = _step_function(model, source_mask, mode)
  moved = 0
  for position in range(STEPS):
    ids = tf.constant([[h[-1]] for h in histories], tf.int32)
    logits, cache, weights = step(ids, tf.constant(position), cache)
    full, full_weights = model.decode(tf.constant(histories, tf.int32),
                                      row_memory, row_mask,
                                      return_attention_scores=True)
    np.testing.assert_allclose(logits[:, 0], full[:, -1], atol=1e-5,
                               err_msg=f"step {position}")
    layers = len(model.decoder.decoder_layers)
    assert len(weights) == len(full_weights) == layers
    for layer, full_layer in zip(weights, full_weights):
      cached = layer["self"].numpy()[:, :, 0]  # [rows, heads, whole blocks]
      np.testing.assert_allclose(cached[..., :position + 1],
                                 full_layer["self"][:, :, -1], atol=1e-6,
                                 err_msg=f"step {position}")
      assert not cached[..., position + 1:].any()
    parents = rng.integers(0, group_size, [batch, group_size])
    moved += int((parents != np.arange(group_size)).sum())
    cache = model.decoder.reorder_cache(cache, tf.constant(parents,
                                                           tf.int32))
    histories = [histories[b * group_size + parents[b, j]] +
                 [int(rng.integers(3, 50))]
                 for b in range(batch) for j in range(group_size)]
  if mode != "eager":
    assert step.experimental_get_tracing_count() == 1
  assert (moved > 0) == (group_size > 1)  # rows took other slots' histories


def test_a_step_writes_its_position_in_place(model):
  """No step copies the cache: the buffer a step is given is the one it
  returns, now holding the new position (so an old cache must not be
  reused)."""
  memory, source_mask = model.encode(SOURCE)
  cache = model.initial_cache(memory, STEPS, group_size=2)
  given = cache["layer_0"]["key"]
  ids = tf.fill([SOURCE.shape[0] * 2, 1], BOS_ID)
  _, cache, _ = model.cached_step(ids, 0, cache, source_mask)
  returned = cache["layer_0"]["key"].numpy()
  assert np.abs(returned).sum() > 0
  np.testing.assert_array_equal(given.numpy(), returned)


def test_beams_share_the_memory_keys_once_per_sentence(model):
  memory, _ = model.encode(SOURCE)
  cache = model.initial_cache(memory, STEPS, group_size=4)
  layer = cache["layer_0"]
  assert layer["memory_key"].shape[0] == SOURCE.shape[0]
  assert cache["ancestors"].shape == (SOURCE.shape[0], 4, 2 * BLOCK_LENGTH)
