"""Label-smoothed cross-entropy against a direct one-hot computation."""

import numpy as np
import tensorflow as tf

from tf_transformer.special_ids import PAD_ID
from tf_transformer.training import loss as loss_lib


def _direct(labels, logits, epsilon):
  vocab = logits.shape[-1]
  log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  target = (1 - epsilon) * np.eye(vocab)[labels] + epsilon / vocab
  per_token = -(target * log_probs).sum(-1)
  weights = labels != PAD_ID
  return (per_token * weights).sum() / weights.sum()


def test_matches_direct_computation_and_ignores_padding():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(3, 5, 11)).astype(np.float32)
  labels = np.array([[4, 5, 6, 3, 0], [7, 3, 0, 0, 0], [9, 9, 9, 9, 3]])
  for epsilon in (0.0, 0.1, 0.2):
    got = loss_lib.label_smoothed_cross_entropy(tf.constant(labels),
                                                tf.constant(logits), epsilon)
    np.testing.assert_allclose(got, _direct(labels, logits, epsilon),
                               rtol=1e-5)
  # Changing logits at padded positions changes nothing.
  changed = logits.copy()
  changed[labels == PAD_ID] += 50.0
  np.testing.assert_allclose(
      loss_lib.label_smoothed_cross_entropy(labels, changed, 0.1),
      loss_lib.label_smoothed_cross_entropy(labels, logits, 0.1), rtol=1e-6)


def test_keras_loss_wrapper_and_half_precision_logits():
  labels = tf.constant([[4, 3, 0]])
  logits = tf.random.stateless_normal([1, 3, 9], [1, 2])
  keras_loss = loss_lib.LabelSmoothedCrossEntropy(0.1)
  np.testing.assert_allclose(
      keras_loss(labels, logits),
      loss_lib.label_smoothed_cross_entropy(labels, logits, 0.1), rtol=1e-6)
  half = loss_lib.label_smoothed_cross_entropy(
      labels, tf.cast(logits, tf.bfloat16), 0.1)
  assert half.dtype == tf.float32
  assert keras_loss.get_config()["label_smoothing"] == 0.1
