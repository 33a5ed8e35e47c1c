"""Dev evaluation during training: what the Trainer hands over every
`eval_every_steps`.

On every worker, the dev loss and perplexity under teacher forcing (the
distributed step the Trainer compiled); on the chief, sacrebleu BLEU and
exact match of greedy translations of the first dev sentences, a few samples
and one sentence's attention weights. All of it goes to the TensorBoard
summaries and one log line.
"""

import math

import numpy as np
import tensorflow as tf
from absl import logging

from tf_transformer import evaluation
from tf_transformer.data import sequences
from tf_transformer.data import sources
from tf_transformer.decoding import text as text_decoding
from tf_transformer.decoding.greedy import greedy_search


class Evaluator:
  """`evaluator(step)` evaluates on the dev split and returns the metrics.

  `loss_step(batch)` gives (loss sum, nll sum, target tokens) of a
  distributed batch; `dev_dataset_fn` makes the dev batches for
  `strategy.distribute_datasets_from_function`.
  """

  def __init__(self, model, vocabulary, spec, strategy, summaries, loss_step,
               dev_dataset_fn, is_chief, eval_max_sentences=200,
               max_decode_length_offset=50, label_smoothing=0.1):
    self.model, self.vocabulary, self.spec = model, vocabulary, spec
    self.strategy, self.summaries = strategy, summaries
    self.loss_step, self.dev_dataset_fn = loss_step, dev_dataset_fn
    self.is_chief = is_chief
    self.eval_max_sentences = eval_max_sentences
    self.label_smoothing = label_smoothing
    self._greedy = tf.function(lambda ids: greedy_search(
        model, ids, max_decode_length_offset))
    self._explained = False  # the dev line's loss vs perplexity

  def loss(self):
    """Dev loss and perplexity per target token (teacher forcing)."""
    totals = np.zeros(3)
    for batch in self.strategy.distribute_datasets_from_function(
        self.dev_dataset_fn):
      totals += [float(v) for v in self.loss_step(batch)]
    loss_sum, nll_sum, tokens = totals
    tokens = max(tokens, 1.0)
    return {"loss": loss_sum / tokens, "nll": nll_sum / tokens,
            "perplexity": math.exp(min(nll_sum / tokens, 50.0))}

  def translations(self):
    """sacrebleu BLEU of greedy translations of the first dev sentences,
    some samples and one sentence's attention weights."""
    pairs = list(sources.text_pairs(self.spec, "dev")())[
        :self.eval_max_sentences]
    source_texts = [s for s, _ in pairs]
    references = [t for _, t in pairs]
    hypotheses = text_decoding.translate(self._greedy, self.vocabulary,
                                         source_texts)
    scores = evaluation.score(hypotheses, references)
    source_ids = sequences.source_ids(self.vocabulary,
                                      tf.constant(source_texts[:1]))
    target_in = sequences.decoder_input(sequences.labels(sequences.subwords(
        self.vocabulary, tf.constant(hypotheses[:1]))))
    attention = self.model.attention_weights(source_ids.to_tensor(),
                                             target_in.to_tensor())
    samples = list(zip(source_texts, references, hypotheses))[:5]
    return ({"bleu_greedy": scores["bleu"],
             "exact_match": scores["exact_match"]}, samples, attention)

  def __call__(self, step):
    metrics = self.loss()
    if self.is_chief:
      scores, samples, attention = self.translations()
      metrics.update(scores)
      self.summaries.translations(step, samples)
      self.summaries.attention(step, attention)
    self.summaries.scalars("dev", step, metrics)
    if not self._explained:
      self._explained = True
      logging.info(
          "dev: loss is the label-smoothed objective training minimizes "
          "(label_smoothing=%g); nll is the plain negative log-likelihood "
          "per token and perplexity = exp(nll), so perplexity is not "
          "exp(loss)", self.label_smoothing)
    logging.info("step %d dev: %s", step, " ".join(
        f"{k}={v:.4g}" for k, v in metrics.items()))
    return metrics
