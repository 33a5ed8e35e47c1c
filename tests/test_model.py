"""The Transformer model: masks, fit, serialization (its decoding step:
tests/test_step.py)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_transformer import Transformer, build_model, get_config
from tf_transformer.config import TransformerConfig
from tf_transformer.special_ids import BOS_ID, EOS_ID, PAD_ID
from tf_transformer.training.loss import LabelSmoothedCrossEntropy
import rounding
from training_helpers import copy_task

SOURCE = tf.constant([[5, 6, 7, 8, 9, EOS_ID, PAD_ID],
                      [10, 11, EOS_ID, PAD_ID, PAD_ID, PAD_ID, PAD_ID]])
TARGET_IN = tf.constant([[BOS_ID, 12, 13, 14, 15, 16],
                         [BOS_ID, 17, 18, 19, PAD_ID, PAD_ID]])
TARGET_LENGTHS = [6, 4]


def _model(overrides=""):
  return build_model(get_config("tiny", overrides))


def test_call_returns_logits_over_the_vocabulary():
  model = _model()
  logits = model((SOURCE, TARGET_IN))
  assert logits.shape == (2, 6, 1000)


def _logit_bounds(model, rows, positions):
  """The float32 bound (rounding.py) of the teacher-forced logits of SOURCE
  and TARGET_IN at `positions` of `rows`: [rows, positions, vocab]."""
  sources = rounding.unpadded(SOURCE)
  cells = [(r, t) for r in rows for t in positions]
  _, bound = rounding.logit_bounds(
      model, [sources[r] for r, _ in cells],
      [list(TARGET_IN.numpy()[r, 1:t + 1]) for r, t in cells])
  return bound.reshape(len(rows), len(positions), -1)


@pytest.mark.numeric
def test_padded_source_positions_change_nothing():
  model = _model("vocab_size=50")
  memory, source_mask = model.encode(SOURCE)
  before = model.decode(TARGET_IN, memory, source_mask)
  changed = tf.where(source_mask[:, :, None], memory, memory + 100.0)
  after = model.decode(TARGET_IN, changed, source_mask)
  # The same function of the real positions: two computations, each within
  # its float32 bound (rounding.py), at the real target positions.
  bound = _logit_bounds(model, [0, 1], range(6))
  for row, length in enumerate(TARGET_LENGTHS):
    rounding.assert_within(after[row, :length], before[row, :length],
                           2 * bound[row, :length])
  # Without the mask the same change does matter, past any rounding (the
  # test can fail).
  no_mask = tf.ones_like(source_mask)
  assert np.abs(model.decode(TARGET_IN, changed, no_mask)
                - model.decode(TARGET_IN, memory, no_mask)).max() > (
                    2 * bound.max())
  # Inside the encoder: padded inputs do not reach the real positions.
  x = tf.random.stateless_normal([2, 7, 64], [3, 4])
  encoded = model.encoder(x, source_mask)
  x_changed = tf.where(source_mask[:, :, None], x, x + 100.0)
  encoded_changed = model.encoder(x_changed, source_mask)
  _, bound = rounding.layer_bounds(model.encoder, {
      "x": x.numpy(), "padding_mask": source_mask.numpy()})
  bound = bound.reshape(2, 7, 64)
  rounding.assert_within(tf.boolean_mask(encoded_changed, source_mask),
                         tf.boolean_mask(encoded, source_mask),
                         2 * bound[source_mask.numpy()])


@pytest.mark.numeric
def test_future_and_padded_target_tokens_change_nothing_before_them():
  model = _model("vocab_size=50")
  before = model((SOURCE, TARGET_IN)).numpy()
  future = tf.concat([TARGET_IN[:, :3], tf.fill([2, 3], 42)], axis=1)
  after = model((SOURCE, future)).numpy()
  # The same function of the first 3 positions: each computation within
  # its float32 bound (rounding.py).
  bound = _logit_bounds(model, [0, 1], range(3))
  rounding.assert_within(after[:, :3], before[:, :3], 2 * bound)
  assert np.abs(after[:, 3:] - before[:, 3:]).max() > 2 * bound.max()


def test_the_removed_xla_attention_switch_of_earlier_runs_loads():
  """Configs and .keras files of release 0.1 hold `xla_attention` (in the
  model's part, or beside it): both load, without it; --hparams names it
  as removed."""
  model = _model()
  config = model.config
  old = config.to_dict()
  old["model"]["xla_attention"] = False
  assert TransformerConfig.from_dict(old) == config
  restored = Transformer.from_config({"config": old, "xla_attention": True})
  assert restored.config == config
  assert "xla_attention" not in restored.get_config()
  with pytest.raises(ValueError, match="'xla_attention': removed in release"):
    get_config("tiny", "xla_attention=false")


def test_trains_under_model_fit():
  model = Transformer(get_config("tiny", "vocab_size=20,num_layers=1"))
  model.compile(optimizer=keras.optimizers.Adam(3e-3),
                loss=LabelSmoothedCrossEntropy(0.1))
  history = model.fit(copy_task(), epochs=10, verbose=0)
  losses = history.history["loss"]
  # Coarse properties of training, with the headroom recorded over seeds
  # 0-7 on oneDNN's AVX-512 and AVX2 kernels and Eigen's (AMD Zen 4): the
  # last epoch's loss 0.42-0.48 of the first's (the bar 0.7), and every
  # epoch's below the one before by 0.067 nats at least.
  assert losses[-1] < 0.7 * losses[0], losses
  assert all(b < a for a, b in zip(losses, losses[1:])), losses


def test_keras_file_round_trip(tmp_path):
  model = _model("share_embeddings=false,norm_position=pre")
  expected = model((SOURCE, TARGET_IN))
  path = str(tmp_path / "m.keras")
  model.save(path)
  loaded = keras.models.load_model(path, safe_mode=True)
  assert isinstance(loaded, Transformer)
  assert loaded.config == model.config
  np.testing.assert_array_equal(loaded((SOURCE, TARGET_IN)), expected)


def test_a_deep_encoder_and_a_shallow_decoder():
  """num_encoder_layers and num_decoder_layers give each stack its depth
  (a student's); both stay num_layers unless given, so a config of release
  1.0 reads as it did; the model saves and loads with its depths."""
  model = _model("num_encoder_layers=3,num_decoder_layers=1")
  weights = model.attention_weights(SOURCE, TARGET_IN)
  assert [len(weights[kind]) for kind in (
      "encoder_self", "decoder_self", "encoder_decoder")] == [3, 1, 1]
  named = model.named_weights()
  assert (len(named.encoder.layers), len(named.decoder.layers)) == (3, 1)
  assert Transformer.from_config(model.get_config()).config == model.config
  assert model((SOURCE, TARGET_IN)).shape == (2, 6, 1000)


def test_attention_weights_for_plots():
  weights = _model().attention_weights(SOURCE, TARGET_IN)
  assert len(weights["encoder_self"]) == 2
  assert weights["encoder_self"][0].shape == (2, 4, 7, 7)
  assert weights["decoder_self"][1].shape == (2, 4, 6, 6)
  assert weights["encoder_decoder"][0].shape == (2, 4, 6, 7)
  cross = weights["encoder_decoder"][0].numpy()
  # A float32 softmax's L quotients sum to 1 within 2 L + 2 roundings (the
  # sum of the exponentials, the quotients, their sum here).
  rounding.assert_within(cross.sum(-1), 1.0, (2 * 7 + 2) * rounding.U32)
  assert np.all(cross[1, :, :, 3:] == 0.0)  # padded source gets no weight
