"""Dev evaluation during training: what the Trainer hands over every
`eval_every_steps`.

On every worker, the dev loss and perplexity under teacher forcing (the
distributed step the Trainer compiled); on the chief, sacrebleu BLEU and
exact match of the dev set's translations (greedy or beam search, batched by
tokens; `eval_max_sentences` > 0 takes only the first ones), a few samples
and one sentence's attention weights. All of it goes to the TensorBoard
summaries and one log line; `best.DevRecord` keeps the best checkpoint by
it.
"""

import math

import numpy as np
import tensorflow as tf
from absl import logging

from tf_transformer import evaluation
from tf_transformer import plots
from tf_transformer.data import sequences
from tf_transformer.data import sources
from tf_transformer.decoding import text as text_decoding
from tf_transformer.decoding.search import DecodingOptions
from tf_transformer.decoding.search import decode
from tf_transformer.training import loss as loss_lib


def dev_pairs(spec, max_sentences=0):
  """The dev split's (source, reference) pairs; the first `max_sentences`
  if > 0."""
  pairs = list(sources.text_pairs(spec, "dev")())
  return pairs[:max_sentences] if max_sentences else pairs


def best_ids_fn(model, decoding):
  """source_ids -> the best hypothesis' ids, one trace for every shape."""
  return tf.function(lambda ids: decode(model, ids, decoding)[0][:, 0],
                     input_signature=[tf.TensorSpec([None, None], tf.int32)],
                     autograph=False)


def translation_scores(decode_fn, vocabulary, pairs, batch_tokens=4096,
                       source_eos=True):
  """({"bleu", "exact_match"}, hypotheses) of translating `pairs`' sources
  (ending with EOS where `source_eos`) with `decode_fn` against their
  references."""
  hypotheses = text_decoding.translate(
      decode_fn, vocabulary, [s for s, _ in pairs], batch_tokens,
      source_eos=source_eos)
  scores = evaluation.score(hypotheses, [t for _, t in pairs])
  return {"bleu": scores["bleu"], "exact_match": scores["exact_match"]}, \
      hypotheses


def teacher_forced_losses(model, vocabulary, pairs, label_smoothing=0.1,
                          batch_size=64):
  """{"loss", "nll"} per target token of `pairs` under teacher forcing: the
  label-smoothed objective (section 5.4) and the plain negative
  log-likelihood, as the dev line reports them.

  Args:
    model: a `Transformer`.
    vocabulary: its `Vocabulary`.
    pairs: (source, reference) strings.
    label_smoothing: epsilon_ls of the loss.
    batch_size: sentences per forward pass.

  Returns:
    {"loss": float, "nll": float}, each a mean over the references' tokens
    (EOS included).
  """
  totals = np.zeros(3)
  for start in range(0, len(pairs), batch_size):
    chunk = pairs[start:start + batch_size]
    source = sequences.source_ids(
        vocabulary, tf.constant([s for s, _ in chunk]),
        eos=model.config.model.source_eos).to_tensor()
    labels = sequences.labels(sequences.subwords(
        sequences.target_side(vocabulary),
        tf.constant([t for _, t in chunk])))
    logits = model((source, sequences.decoder_input(labels).to_tensor()),
                   training=False)
    totals += [float(tf.reduce_sum(x)) for x in loss_lib.token_losses(
        labels.to_tensor(), logits, label_smoothing, jit_compile=False)]
  loss_sum, nll_sum, tokens = totals
  tokens = max(tokens, 1.0)
  return {"loss": loss_sum / tokens, "nll": nll_sum / tokens}


class Evaluator:
  """`evaluator(step)` evaluates on the dev split and returns the metrics.

  `loss_step(batch)` gives (loss sum, nll sum, target tokens) of a
  distributed batch; `dev_dataset_fn` makes the dev batches for
  `strategy.distribute_datasets_from_function`.
  """

  def __init__(self, model, vocabulary, spec, strategy, summaries, loss_step,
               dev_dataset_fn, is_chief, eval_max_sentences=0,
               decoding=DecodingOptions(method="greedy"), label_smoothing=0.1,
               batch_tokens=4096):
    self.model, self.vocabulary, self.spec = model, vocabulary, spec
    self.strategy, self.summaries = strategy, summaries
    self.loss_step, self.dev_dataset_fn = loss_step, dev_dataset_fn
    self.is_chief = is_chief
    self.eval_max_sentences = eval_max_sentences
    self.label_smoothing = label_smoothing
    self.decoding, self.batch_tokens = decoding, batch_tokens
    self._decode = best_ids_fn(model, decoding)
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
    """sacrebleu BLEU of the dev set's translations (the first
    `eval_max_sentences` if > 0), some samples, one sentence's attention
    weights and its (source, translation) subwords."""
    pairs = dev_pairs(self.spec, self.eval_max_sentences)
    source_texts = [s for s, _ in pairs]
    references = [t for _, t in pairs]
    source_eos = self.model.config.model.source_eos
    scores, hypotheses = translation_scores(
        self._decode, self.vocabulary, pairs, self.batch_tokens, source_eos)
    source_ids = sequences.source_ids(self.vocabulary,
                                      tf.constant(source_texts[:1]),
                                      eos=source_eos)
    labels = sequences.labels(sequences.subwords(
        self.vocabulary, tf.constant(hypotheses[:1])))
    attention = self.model.attention_weights(
        source_ids.to_tensor(), sequences.decoder_input(labels).to_tensor())
    samples = list(zip(source_texts, references, hypotheses))[:5]
    tokens = [plots.tokens(self.vocabulary.pieces(ids[0]).numpy())
              for ids in (source_ids, labels)]
    return scores, samples, attention, tokens

  def __call__(self, step):
    metrics = self.loss()
    if self.is_chief:
      scores, samples, attention, tokens = self.translations()
      metrics.update(scores)
      self.summaries.translations(step, samples)
      self.summaries.attention(step, attention, *tokens)
    self.summaries.scalars("dev", step, metrics)
    if not self._explained:
      self._explained = True
      logging.info(
          "dev: loss is the label-smoothed objective training minimizes "
          "(label_smoothing=%g); nll is the plain negative log-likelihood "
          "per token and perplexity = exp(nll), so perplexity is not "
          "exp(loss); bleu is sacrebleu's on %s of %s search",
          self.label_smoothing,
          f"the first {self.eval_max_sentences} sentences"
          if self.eval_max_sentences else "the whole dev set",
          self.decoding.method)
    logging.info("step %d dev: %s", step, " ".join(
        f"{k}={v:.4g}" for k, v in metrics.items()))
    return metrics
