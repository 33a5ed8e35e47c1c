"""Forced decoding: the log-probability the model gives a given translation,
log P(Y | X) = sum_t log P(y_t | y_<t, X), under teacher forcing (the
decoder reads the target shifted right, section 3.1; the probabilities are
its softmax output, section 3.4). What OpenNMT-tf's `score`, fairseq's
`--score-reference`, `marian-scorer` and CTranslate2's `score_batch` give:
natural log, the target's subwords and its EOS, no length penalty.

`score_texts` is the graph code of the export's `score` signature (and of
bin/score.py on a run); `Scorer` runs it, or CTranslate2's `score_batch`,
over lists of lines.
"""

import numpy as np
import tensorflow as tf

from tf_transformer.data import sequences
from tf_transformer.decoding import ct2_runtime


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
  padded = labels.to_tensor()
  logits = model((source_ids, target_in), training=False)
  # log_softmax picked at the labels, without a second [batch, T, vocab].
  picked = (tf.gather(logits, padded, batch_dims=2)
            - tf.reduce_logsumexp(logits, axis=-1))
  mask = tf.sequence_mask(labels.row_lengths(), tf.shape(padded)[1])
  return tf.where(mask, picked, tf.zeros_like(picked))


def score_texts(model, tokenizer, source, target, max_input_tokens,
                max_target_tokens):
  """The log-probability of each target string given its source.

  Sources are cut to `max_input_tokens` subwords as the translation
  signatures cut them, targets to `max_target_tokens` (the longest output the
  search gives).

  Args:
    model: a `Transformer` or an `Ensemble`.
    tokenizer: the in-graph SentencePiece tokenizer.
    source, target: [batch] strings, the same count.
    max_input_tokens, max_target_tokens: the cuts.
  Returns:
    {"log_prob" [batch], "token_log_probs" [batch, T], "lengths" [batch]
    int32, the scored tokens, EOS included}.
  """
  source_ids = sequences.source_ids(tokenizer, source,
                                    max_input_tokens).to_tensor()
  labels = sequences.labels(
      sequences.subwords(tokenizer, target)[:, :max_target_tokens])
  values = token_log_probs(model, source_ids, labels)
  return {"log_prob": tf.reduce_sum(values, axis=1),
          "token_log_probs": values,
          "lengths": tf.cast(labels.row_lengths(), tf.int32)}


class Scorer:
  """`score(sources, targets) -> [(log_prob, [token log-probs])]` over an
  export's `score` signature, an in-process module's, or CTranslate2."""

  def __init__(self, batch_fn):
    self._batch_fn = batch_fn  # (sources, targets) -> [(total, tokens)]

  @classmethod
  def from_export(cls, path):
    """A SavedModel version or a CTranslate2 directory (bin/export.py)."""
    if ct2_runtime.is_ct2_model(path):
      decoder = ct2_runtime.CT2Decoder(path)
      return cls(lambda s, t: [(float(np.sum(v)), list(v))
                               for v in decoder.token_log_probs(s, t)])
    if not tf.saved_model.contains_saved_model(path):
      raise FileNotFoundError(
          f"{path}: neither a SavedModel version (saved_model.pb), a "
          f"CTranslate2 model ({ct2_runtime.MODEL_FILE}) nor a run "
          "directory (config.json)")
    import tensorflow_text  # noqa: F401  pylint: disable=unused-import,g-import-not-at-top
    loaded = tf.saved_model.load(path)
    if "score" not in loaded.signatures:
      raise ValueError(f"{path} has no score signature (exported before "
                       "scoring existed): export it again")
    return cls(_rows(loaded.signatures["score"]))

  @classmethod
  def from_module(cls, module):
    """A `TranslationModule` run in-process (a run's checkpoint)."""
    # The closure holds the module: its tf.functions hold it only weakly.
    return cls(_rows(lambda **tensors: module.score(**tensors)))

  def score(self, sources, targets, batch_size=32, progress=None):
    if len(sources) != len(targets):
      raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
    results = []
    for start in range(0, len(sources), batch_size):
      end = start + batch_size
      results += self._batch_fn(list(sources[start:end]),
                                list(targets[start:end]))
      if progress:
        progress.add(len(sources[start:end]))
    return results


def _rows(score_fn):
  def batch(sources, targets):
    strings = lambda texts: tf.constant(texts, tf.string, shape=[len(texts)])
    out = score_fn(source=strings(sources), target=strings(targets))
    totals, values = out["log_prob"].numpy(), out["token_log_probs"].numpy()
    return [(float(total), [float(v) for v in row[:length]])
            for total, row, length in zip(totals, values,
                                          out["lengths"].numpy())]
  return batch


def output_line(log_prob, token_log_probs, with_tokens=False):
  """bin/score.py's line: `LOG_PROB<TAB>TOKENS[<TAB>per-token values]`."""
  fields = [f"{log_prob:.4f}", str(len(token_log_probs))]
  if with_tokens:
    fields.append(" ".join(f"{v:.4f}" for v in token_log_probs))
  return "\t".join(fields)
