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
ten passes over them. Under TensorFlow, compiled with XLA (`jit_compile=True`,
the default; it takes only tensors, so it runs inside every replica of a
distribution strategy) the loss and its gradient
are a few fused passes over the logits (docs/performance.md has the
figures). Written with `keras.ops`, so it runs on every Keras backend (JAX
and PyTorch compile it with the whole step).
"""

import keras

from tf_transformer.layers import compiled
from tf_transformer.special_ids import PAD_ID

ops = keras.ops


@ops.custom_gradient
def _smoothed_losses(logits, labels, label_smoothing):
  """[2, tokens]: the loss and the nll per token, from float32 logits
  [tokens, vocab], int32 labels [tokens] and a float32 scalar epsilon_ls,
  with the closed-form gradient of the module docstring. One output, as
  every backend's custom gradient takes (PyTorch's only one)."""
  vocab_size = ops.shape(logits)[-1]
  log_normalizer = ops.logsumexp(logits, axis=-1)
  # One 1-D gather of each token's reference logit.
  flat_index = ops.arange(ops.shape(labels)[0]) * vocab_size + labels
  reference = ops.take(ops.reshape(logits, (-1,)), flat_index)
  nll = log_normalizer - reference
  losses = (nll + label_smoothing * reference
            - label_smoothing * ops.mean(logits, axis=-1))

  def grad(*args, upstream=None):
    # TensorFlow and JAX pass the upstream gradient [2, tokens] as the one
    # argument; PyTorch by name, after the forward's inputs.
    upstream = args[0] if upstream is None else upstream
    d_losses, d_nll = upstream[0], upstream[1]
    probs = ops.exp(logits - log_normalizer[:, None])
    on_reference = ops.one_hot(labels, vocab_size, dtype=logits.dtype)
    d_losses, d_nll = d_losses[:, None], d_nll[:, None]
    d_logits = (probs * (d_losses + d_nll)
                - on_reference * ((1.0 - label_smoothing) * d_losses + d_nll)
                - d_losses * (label_smoothing /
                              ops.cast(vocab_size, logits.dtype)))
    return d_logits, None, None

  return ops.stack([losses, nll]), grad


def token_losses(labels, logits, label_smoothing=0.1, jit_compile=True):
  """Per-token losses of section 5.4.

  Args:
    labels: [batch, length] int reference ids, PAD_ID at padding.
    logits: [batch, length, vocab] (cast to float32).
    label_smoothing: epsilon_ls (0.1 in the paper).
    jit_compile: under TensorFlow, run the loss and its gradient under XLA
      (same values to float32 rounding); other backends compile it with
      their step.
  Returns:
    (smoothed loss, negative log-likelihood for perplexity, non-padding
    weights), each [batch, length] float32, zero at padding.
  """
  core = compiled.xla(_smoothed_losses) if jit_compile else _smoothed_losses
  shape = ops.shape(labels)
  logits = ops.cast(logits, "float32")
  losses, nll = ops.unstack(
      core(ops.reshape(logits, (-1, ops.shape(logits)[-1])),
           ops.reshape(ops.cast(labels, "int32"), (-1,)),
           ops.convert_to_tensor(label_smoothing, "float32")), 2)
  weights = ops.cast(ops.not_equal(labels, PAD_ID), "float32")
  return (ops.reshape(losses, shape) * weights,
          ops.reshape(nll, shape) * weights, weights)


def label_smoothed_cross_entropy(labels, logits, label_smoothing=0.1,
                                 jit_compile=True):
  """Mean loss per non-padding target token (section 5.4): `token_losses`'
  sum over their weights' sum."""
  losses, _, weights = token_losses(labels, logits, label_smoothing,
                                    jit_compile)
  return ops.sum(losses) / ops.maximum(ops.sum(weights), 1.0)


@keras.saving.register_keras_serializable(package="tf_transformer")
class LabelSmoothedCrossEntropy(keras.losses.Loss):
  """`label_smoothed_cross_entropy` as a Keras loss, for `model.fit`."""

  def __init__(self, label_smoothing=0.1, name="label_smoothed_cross_entropy",
               **kwargs):
    super().__init__(name=name, **kwargs)
    self.label_smoothing = label_smoothing

  def call(self, y_true, y_pred):
    return label_smoothed_cross_entropy(ops.cast(y_true, "int32"), y_pred,
                                        self.label_smoothing)

  def get_config(self):
    return {**super().get_config(), "label_smoothing": self.label_smoothing}
