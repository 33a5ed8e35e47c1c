"""Label-smoothed cross-entropy against a direct one-hot computation."""

import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.special_ids import PAD_ID
from tf_transformer.training import loss as loss_lib
import rounding

pytestmark = pytest.mark.numeric
# A float32 log-softmax of V logits: V exponentials (FUNCTION u each), their
# sum (V roundings), its log (FUNCTION more), the difference (one more):
# within (2 FUNCTION + V + 2) u of |log-sum-exp - max| + 1 (the sum is at
# least 1); a label-smoothed loss sums V products of those (one more each)
# and divides: a few more.


def _token_bound(logits, labels, epsilon):
  """[..., ] bound on each token's float32 loss (and nll): the log-softmax's
  error (above) weighted by the target's mass (1), and the V products and
  their sum, within (V + 2) u of sum |target log p|."""
  logits = np.asarray(logits, np.float64)
  vocab = logits.shape[-1]
  top = logits.max(-1, keepdims=True)
  lse = top + np.log(np.exp(logits - top).sum(-1, keepdims=True))
  log_probs = logits - lse
  target = (1 - epsilon) * np.eye(vocab)[labels] + epsilon / vocab
  spread = (np.abs(lse - top)[..., 0] + 1) * (2 * rounding.FUNCTION + vocab
                                                 + 2)
  return rounding.U32 * (spread + (vocab + 2) * (
      np.abs(target * log_probs).sum(-1) + np.abs(log_probs).max(-1)))


def _loss_bound(logits, labels, epsilon):
  """The float32 loss, a mean over the n real tokens of their losses:
  their bounds' mean, and n + 1 roundings of the sum and quotient."""
  weights = np.asarray(labels) != PAD_ID
  tokens = _token_bound(logits, labels, epsilon)[weights]
  loss = abs(_direct(np.asarray(labels), np.asarray(logits, np.float64),
                     epsilon))
  return tokens.mean() + (weights.sum() + 1) * rounding.U32 * loss


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
    # float32 against float64 (NumPy's): the float32 computation's bound.
    rounding.assert_within(got, _direct(labels, logits.astype(np.float64),
                                        epsilon),
                           _loss_bound(logits, labels, epsilon))
  # Changing logits at padded positions changes nothing: their losses are
  # weighted by an exact 0, the same numbers are summed.
  changed = logits.copy()
  changed[labels == PAD_ID] += 50.0
  np.testing.assert_array_equal(
      loss_lib.label_smoothed_cross_entropy(labels, changed, 0.1),
      loss_lib.label_smoothed_cross_entropy(labels, logits, 0.1))


def test_keras_loss_wrapper_and_half_precision_logits():
  labels = tf.constant([[4, 3, 0]])
  logits = tf.random.stateless_normal([1, 3, 9], [1, 2])
  keras_loss = loss_lib.LabelSmoothedCrossEntropy(0.1)
  # Two float32 computations of one loss, each within its bound.
  rounding.assert_within(
      keras_loss(labels, logits),
      loss_lib.label_smoothed_cross_entropy(labels, logits, 0.1),
      2 * _loss_bound(logits.numpy(), labels.numpy(), 0.1))
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
  # Two float32 computations of each token's loss and nll, each within
  # its bound.
  weights = (labels.numpy() != PAD_ID)
  tokens = _token_bound(logits.numpy(), labels.numpy(), 0.1) * weights
  for got, want in zip(ours, refs):
    rounding.assert_within(got, want, 2 * tokens)
  # The gradients, (softmax(z) - target) times each output's weight: the
  # softmax within (2 FUNCTION + V + 2) u of itself, the target one u, the
  # difference and the products a few more, of |softmax| + |target|.
  z = logits.numpy().astype(np.float64)
  probs = np.exp(z - z.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  # The larger of the two targets (the loss's smoothed, the nll's one-hot).
  target = np.eye(40)[labels.numpy()] + 0.1 / 40
  magnitude = (probs + target) * weights[..., None]
  each = (2 * rounding.FUNCTION + 40 + 8) * rounding.U32 * magnitude
  for got, want, scale in zip(our_grads, ref_grads, (1.3, 0.7, 1.3 + 0.7)):
    assert float(tf.reduce_max(tf.abs(want))) > 0.1  # a real gradient
    rounding.assert_within(got, want, 2 * scale * each)
