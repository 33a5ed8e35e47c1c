"""Forced decoding: the log-probability the model gives a given translation,
log P(Y | X) = sum_t log P(y_t | y_<t, X), under teacher forcing (the
decoder reads the target shifted right, section 3.1; the probabilities are
its softmax output, section 3.4). What OpenNMT-tf's `score`, fairseq's
`--score-reference`, `marian-scorer` and CTranslate2's `score_batch` give:
natural log, the target's subwords and its EOS, no length penalty.

`score_texts` scores strings with a model's call; the export's `score`
signature computes the same from the teacher-forced pass it shares with the
attention signatures (`target_labels`, `label_log_probs`, `scores_of`).
`translators/scorer.py` runs a signature, or CTranslate2's `score_batch`, over
lists of lines.
"""

import tensorflow as tf

from tf_transformer.data import sequences


def token_log_probs(model, source_ids, labels):
  """log P(y_t | y_<t, X) of each label, teacher forced.

  Args:
    model: a `Transformer` or an `Ensemble`.
    source_ids: [batch, S], EOS-terminated, PAD-padded.
    labels: ragged [batch, (T)] ids ending in EOS.
  Returns:
    [batch, T] float32, 0 past each row's length.
  """
  target_in = sequences.decoder_input(labels).to_tensor()
  return label_log_probs(model((source_ids, target_in), training=False),
                         labels)


def label_log_probs(logits, labels):
  """`token_log_probs` of logits already computed.

  Args:
    logits: [batch, T, vocab] of a teacher-forced pass over `labels`.
    labels: ragged [batch, (T)] ids ending in EOS.
  Returns:
    [batch, T] float32, 0 past each row's length.
  """
  padded = labels.to_tensor()
  # log_softmax picked at the labels, without a second [batch, T, vocab].
  picked = (tf.gather(logits, padded, batch_dims=2)
            - tf.reduce_logsumexp(logits, axis=-1))
  mask = tf.sequence_mask(labels.row_lengths(), tf.shape(padded)[1])
  return tf.where(mask, picked, tf.zeros_like(picked))


def target_labels(tokenizer, target, max_target_tokens):
  """The ids a target string is scored (and force-aligned) as.

  Args:
    tokenizer: the target side's in-graph SentencePiece tokenizer.
    target: [batch] strings.
    max_target_tokens: the cut (the longest output the search gives).
  Returns:
    ragged [batch, (T)] int: the subwords, cut, then EOS.
  """
  return sequences.labels(
      sequences.subwords(tokenizer, target)[:, :max_target_tokens])


def score_texts(model, tokenizer, source, target, max_input_tokens,
                max_target_tokens, target_tokenizer=None):
  """The log-probability of each target string given its source.

  Sources are cut to `max_input_tokens` subwords as the translation
  signatures cut them, targets to `max_target_tokens` (the longest output the
  search gives).

  Args:
    model: a `Transformer` or an `Ensemble`.
    tokenizer: the in-graph SentencePiece tokenizer.
    source, target: [batch] strings, the same count.
    max_input_tokens, max_target_tokens: the cuts.
    target_tokenizer: the target's, where the languages have their own
      (an imported Marian model's); None: `tokenizer`.
  Returns:
    {"log_prob" [batch], "token_log_probs" [batch, T], "lengths" [batch]
    int32, the scored tokens, EOS included}.
  """
  source_ids = sequences.source_ids(
      tokenizer, source, max_input_tokens,
      eos=model.config.model.source_eos).to_tensor()
  labels = target_labels(target_tokenizer or tokenizer, target,
                         max_target_tokens)
  return scores_of(token_log_probs(model, source_ids, labels), labels)


def scores_of(values, labels):
  """`score_texts`'s dict of `token_log_probs` `values` of `labels` (the
  export's `forced_alignment` passes `label_log_probs` of the pass that also
  gives its attention)."""
  return {"log_prob": tf.reduce_sum(values, axis=1),
          "token_log_probs": values,
          "lengths": tf.cast(labels.row_lengths(), tf.int32)}
