"""Label-smoothed cross-entropy over non-padding target tokens (section 5.4).

With smoothing epsilon_ls, the target distribution puts 1 - epsilon_ls on the
reference token and spreads epsilon_ls uniformly over the vocabulary, as in
Szegedy et al. (2016), which the paper cites. It is computed from
log-softmax without building a one-hot [tokens, vocab] tensor.
"""

import keras
import tensorflow as tf

from tf_transformer.special_ids import PAD_ID


def token_losses(labels, logits, label_smoothing=0.1):
  """Per-token smoothed loss, per-token negative log-likelihood (for
  perplexity) and the non-padding weights, each [batch, length], float32;
  padding positions are zero."""
  log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32))
  nll = -tf.gather(log_probs, labels, batch_dims=2)
  uniform = -tf.reduce_mean(log_probs, axis=-1)
  losses = (1.0 - label_smoothing) * nll + label_smoothing * uniform
  weights = tf.cast(tf.not_equal(labels, PAD_ID), tf.float32)
  return losses * weights, nll * weights, weights


def label_smoothed_cross_entropy(labels, logits, label_smoothing=0.1):
  """Mean loss per non-padding target token."""
  losses, _, weights = token_losses(labels, logits, label_smoothing)
  return tf.reduce_sum(losses) / tf.maximum(tf.reduce_sum(weights), 1.0)


@keras.saving.register_keras_serializable(package="tf_transformer")
class LabelSmoothedCrossEntropy(keras.losses.Loss):
  """`label_smoothed_cross_entropy` as a Keras loss, for `model.fit`."""

  def __init__(self, label_smoothing=0.1, name="label_smoothed_cross_entropy",
               **kwargs):
    super().__init__(name=name, **kwargs)
    self.label_smoothing = label_smoothing

  def call(self, y_true, y_pred):
    return label_smoothed_cross_entropy(tf.cast(y_true, tf.int32), y_pred,
                                        self.label_smoothing)

  def get_config(self):
    return {**super().get_config(), "label_smoothing": self.label_smoothing}
