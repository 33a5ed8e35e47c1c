"""Word-level distillation (train.py --distill_from): the loss against the
teacher's top-k probabilities, and a student run that mixes it in."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.run.runner import Runner
from tf_transformer.training.loss import top_k_distillation_losses
from test_fine_tuning import OPTIONS, OTHER_DATA, _config


def test_the_loss_is_the_cross_entropy_against_the_renormalized_top_k():
  rng = np.random.default_rng(0)
  student = rng.normal(size=(2, 3, 11)).astype(np.float32)
  teacher = rng.normal(size=(2, 3, 11)).astype(np.float32)
  k = 4
  expected = np.zeros((2, 3))
  gradient = np.zeros_like(student)
  for b in range(2):
    for t in range(3):
      top = np.argsort(-teacher[b, t])[:k]
      p = np.exp(teacher[b, t, top]) / np.exp(teacher[b, t, top]).sum()
      z = student[b, t]
      log_q = z - np.log(np.exp(z).sum())
      expected[b, t] = -(p * log_q[top]).sum()
      gradient[b, t] = np.exp(log_q)
      gradient[b, t, top] -= p
  z = tf.constant(student)
  with tf.GradientTape() as tape:
    tape.watch(z)
    losses = top_k_distillation_losses(z, tf.constant(teacher), k)
  # float32 sums of 11 terms of magnitude < 10: rounding far below 1e-5.
  np.testing.assert_allclose(losses, expected, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(tape.gradient(losses, z), gradient, atol=1e-6)


def test_with_every_piece_its_minimum_is_the_teachers_entropy():
  teacher = keras.random.normal((1, 2, 7), seed=1)
  p = keras.ops.softmax(teacher)
  entropy = -keras.ops.sum(p * keras.ops.log(p), axis=-1)
  np.testing.assert_allclose(
      top_k_distillation_losses(teacher, teacher, 7), entropy, atol=1e-5)
  assert np.all(np.asarray(top_k_distillation_losses(
      teacher * 0.5, teacher, 7)) > np.asarray(entropy))


@pytest.mark.slow
def test_a_student_run_mixes_in_the_teachers_top_k(trained_numbers_run,
                                                   tmp_path):
  """Weight 0 trains exactly as without a teacher; weight 0.5 otherwise;
  a teacher of another vocabulary is refused, naming the flag."""
  config = _config("dropout_rate=0.0,num_decoder_layers=1", steps=3)
  start = dict(init_from=str(trained_numbers_run), **OPTIONS)
  plain = Runner(str(tmp_path / "plain")).train(config, OTHER_DATA, **start)
  zero = Runner(str(tmp_path / "zero")).train(
      config, OTHER_DATA, distill_from=str(trained_numbers_run),
      distill_weight=0.0, **start)
  half = Runner(str(tmp_path / "half")).train(
      config, OTHER_DATA, distill_from=str(trained_numbers_run),
      distill_top_k=4, **start)
  np.testing.assert_allclose(zero["losses"], plain["losses"], rtol=1e-6)
  assert np.all(np.isfinite(half["losses"]))
  assert abs(half["losses"][0] - plain["losses"][0]) > 1e-3
  with pytest.raises(ValueError, match=r"--distill_from=.* has another "
                     r"vocabulary than .*other"):
    Runner(str(tmp_path / "other")).train(
        config.replace(vocab_size=300), OTHER_DATA, vocab_size=300,
        distill_from=str(trained_numbers_run), **OPTIONS)
