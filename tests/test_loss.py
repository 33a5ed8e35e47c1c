"""Label-smoothed cross-entropy against a direct one-hot computation."""

import numpy as np
import pytest
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


def _autodiff_reference(labels, logits, epsilon):
  """The loss by autodiff through log_softmax, as the paper's recipe
  reads: the closed-form gradient must equal this."""
  log_probs = tf.nn.log_softmax(logits)
  nll = -tf.gather(log_probs, labels, batch_dims=2)
  losses = (1 - epsilon) * nll - epsilon * tf.reduce_mean(log_probs, -1)
  weights = tf.cast(labels != PAD_ID, tf.float32)
  return losses * weights, nll * weights


@pytest.mark.parametrize("jit_compile", [True, False])
@pytest.mark.parametrize("graph", [True, False])
def test_closed_form_gradient_equals_autodiff(jit_compile, graph):
  rng = np.random.default_rng(1)
  logits = tf.constant(4 * rng.normal(size=(3, 6, 40)), tf.float32)
  labels = tf.constant(rng.integers(0, 40, size=(3, 6)), tf.int32)

  def values_and_gradients(logits):
    with tf.GradientTape(persistent=True) as tape:
      tape.watch(logits)
      losses, nll, _ = loss_lib.token_losses(labels, logits, 0.1,
                                             jit_compile=jit_compile)
      ref_losses, ref_nll = _autodiff_reference(labels, logits, 0.1)
      # Different weights on the two outputs, and both at once.
      ours = [tf.reduce_sum(1.3 * losses), tf.reduce_sum(0.7 * nll)]
      ours.append(ours[0] + ours[1])
      refs = [tf.reduce_sum(1.3 * ref_losses), tf.reduce_sum(0.7 * ref_nll)]
      refs.append(refs[0] + refs[1])
    return ((losses, nll), (ref_losses, ref_nll),
            [tape.gradient(o, logits) for o in ours],
            [tape.gradient(r, logits) for r in refs])

  if graph:
    values_and_gradients = tf.function(values_and_gradients)
  ours, refs, our_grads, ref_grads = values_and_gradients(logits)
  for got, want in zip(ours, refs):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  for got, want in zip(our_grads, ref_grads):
    assert float(tf.reduce_max(tf.abs(want))) > 0.1  # a real gradient
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
