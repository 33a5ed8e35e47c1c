"""Label-smoothed cross-entropy over non-padding target tokens (section 5.4).

With smoothing epsilon_ls, the target distribution puts 1 - epsilon_ls on the
reference token and spreads epsilon_ls uniformly over the vocabulary, as in
Szegedy et al. (2016), which the paper cites. Per token, with z the logits,
y the reference and V the vocabulary size:

  nll  = logsumexp(z) - z_y
  loss = logsumexp(z) - (1 - epsilon_ls) z_y - epsilon_ls mean(z)
  d loss / d z = softmax(z) - (1 - epsilon_ls) onehot(y) - epsilon_ls / V

so neither a one-hot [tokens, vocab] target nor the log-softmax is kept for
the backward pass; the gradient is written directly. At the paper's
vocabulary the logits are the largest tensor of a training step ([tokens,
37000]), and autodiff through log_softmax, a gather and a mean made about
ten passes over them. Compiled with XLA (`jit_compile=True`, the default;
it takes only tensors, so it runs inside every replica of a distribution
strategy, like the attention core) the loss and its gradient are a few
fused passes over the logits (docs/performance.md has the figures).
"""

import keras
import tensorflow as tf

from tf_transformer.special_ids import PAD_ID


@tf.custom_gradient
def _smoothed_losses(logits, labels, label_smoothing):
  """(loss, nll) per token from float32 logits [..., vocab] and labels
  [...], with the closed-form gradient of the module docstring."""
  log_normalizer = tf.reduce_logsumexp(logits, axis=-1)
  reference = tf.gather(logits, labels, batch_dims=labels.shape.rank)
  nll = log_normalizer - reference
  losses = (nll + label_smoothing * reference
            - label_smoothing * tf.reduce_mean(logits, axis=-1))

  def grad(d_losses, d_nll):
    probs = tf.exp(logits - log_normalizer[..., tf.newaxis])
    vocab_size = tf.cast(tf.shape(logits)[-1], logits.dtype)
    on_reference = tf.one_hot(labels, tf.shape(logits)[-1],
                              dtype=logits.dtype)
    d_losses, d_nll = d_losses[..., tf.newaxis], d_nll[..., tf.newaxis]
    d_logits = (probs * (d_losses + d_nll)
                - on_reference * ((1.0 - label_smoothing) * d_losses + d_nll)
                - d_losses * (label_smoothing / vocab_size))
    return d_logits, None, None

  return (losses, nll), grad


_XLA_SMOOTHED_LOSSES = tf.function(_smoothed_losses, jit_compile=True)


def token_losses(labels, logits, label_smoothing=0.1, jit_compile=True):
  """Per-token smoothed loss, per-token negative log-likelihood (for
  perplexity) and the non-padding weights, each [batch, length], float32;
  padding positions are zero. `jit_compile` runs the loss and its gradient
  under XLA (same values to float32 rounding)."""
  core = _XLA_SMOOTHED_LOSSES if jit_compile else _smoothed_losses
  losses, nll = core(tf.cast(logits, tf.float32), tf.cast(labels, tf.int32),
                     tf.constant(label_smoothing, tf.float32))
  weights = tf.cast(tf.not_equal(labels, PAD_ID), tf.float32)
  return losses * weights, nll * weights, weights


def label_smoothed_cross_entropy(labels, logits, label_smoothing=0.1,
                                 jit_compile=True):
  """Mean loss per non-padding target token."""
  losses, _, weights = token_losses(labels, logits, label_smoothing,
                                    jit_compile)
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
