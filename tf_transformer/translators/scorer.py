"""Scoring lists of lines: the log-probability an export (its `score`
signature, `decoding/scoring.py`), an in-process `TranslationModule` or a
CTranslate2 export gives each target given its source, and with
`alignment` each pair's word alignment (the `forced_alignment` signature,
`decoding/alignment.py`); what bin/score.py prints."""

import numpy as np
import tensorflow as tf

from tf_transformer.data.text_batches import batch_indices, in_input_order
from tf_transformer.interop import ct2
from tf_transformer.translators import ct2_runtime
from tf_transformer.serving.output import score_rows
from tf_transformer.translators.translator import counter_of
from tf_transformer.translators.translator import load_saved_model
from tf_transformer.translators.translator import string_batch
from tf_transformer.translators.translator import token_lengths


class Scorer:
  """`score(sources, targets) -> [(log_prob, [token log-probs])]` over an
  export's `score` signature, an in-process module's, or CTranslate2; built
  by `from_export` or `from_module`. With `alignment`, each result has a
  third item, the pair's word alignment (Pharaoh "i-j" pairs).

  Args:
    batch_fn: (sources, targets) -> [(log_prob, [token log-probs])], or
      with alignments [(log_prob, [token log-probs], pairs)].
    count_fn: texts -> (subwords per text, the input limit), for batches
      of pairs of like length (`translator.token_lengths`).
  """

  def __init__(self, batch_fn, count_fn):
    self._batch_fn = batch_fn  # (sources, targets) -> [(total, tokens)]
    self._count_fn = count_fn

  @classmethod
  def from_export(cls, path, alignment=False, alignment_layer=None):
    """A scorer over an export.

    Args:
      path: a SavedModel version or a CTranslate2 directory (bin/export.py).
      alignment: also align each pair's words.
      alignment_layer: the decoder layer (from 1) whose attention, heads
        averaged, aligns them; None: the last (a CTranslate2 export's:
        its own).
    Returns:
      The `Scorer`; FileNotFoundError naming `path` where it is neither,
      ValueError where the export lacks the signature (or CTranslate2
      attention) it needs.
    """
    if ct2.is_ct2_model(path):
      decoder = ct2_runtime.CT2Decoder(path)
      if alignment:
        return cls(lambda s, t: [
            (float(np.sum(v)), list(v), pairs)
            for v, pairs in decoder.forced_alignments(s, t, alignment_layer)],
                   decoder.count_input_tokens)
      return cls(lambda s, t: [(float(np.sum(v)), list(v))
                               for v in decoder.token_log_probs(s, t)],
                 decoder.count_input_tokens)
    if not tf.saved_model.contains_saved_model(path):
      raise FileNotFoundError(
          f"{path}: neither a SavedModel version (saved_model.pb), a "
          f"CTranslate2 model ({ct2.MODEL_FILE}) nor a run "
          "directory (config.json)")
    loaded = load_saved_model(path)
    name = "forced_alignment" if alignment else "score"
    return cls(_rows(loaded.signatures[name], alignment, alignment_layer),
               counter_of(loaded.count_input_tokens))

  @classmethod
  def from_module(cls, module, alignment=False, alignment_layer=None):
    """A scorer over a `TranslationModule` run in-process (a run's
    checkpoint).

    Args:
      module: the `TranslationModule`.
      alignment, alignment_layer: as `from_export`'s.
    Returns:
      The `Scorer`.
    """
    # The closure holds the module: its tf.functions hold it only weakly.
    counts = counter_of(module.count_input_tokens)
    if alignment:
      return cls(_rows(lambda **tensors: module.forced_alignment(**tensors),
                       True, alignment_layer), counts)
    return cls(_rows(lambda **tensors: module.score(**tensors)), counts)

  def score(self, sources, targets, batch_size=32, progress=None,
            batch_tokens=0):
    """log P(target | source) of each pair (`decoding/scoring.py`).

    Args:
      sources, targets: line-aligned strings.
      batch_size: pairs a batch (at most, with `batch_tokens`).
      progress: a `progress.Progress`, told of each scored batch.
      batch_tokens: > 0: the pairs are sorted by length (the longer side's
        subwords, as the source's tokenizer counts them and cut at the
        input limit: an estimate where the sides differ) and cut into
        batches of at most this many padded tokens a side, as
        `Translator.translate` batches; 0: `batch_size` pairs a batch in
        file order.
    Returns:
      [(log_prob, [each target subword's and the EOS's log-prob])], in the
      pairs' order; ValueError where the counts differ.
    """
    if len(sources) != len(targets):
      raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
    lengths = lambda: [max(s, t) for s, t in zip(
        token_lengths(self._count_fn, sources),
        token_lengths(self._count_fn, targets))]
    run = lambda rows: self._batch_fn([sources[r] for r in rows],
                                      [targets[r] for r in rows])
    return list(in_input_order(len(sources), batch_indices(
        len(sources), batch_size, batch_tokens, lengths), run, progress))


def _rows(score_fn, alignment=False, alignment_layer=None):
  """A `Scorer` batch function over a `score` (or, with `alignment`,
  `forced_alignment`) signature's function."""
  def batch(sources, targets):
    out = {key: value.numpy() for key, value in score_fn(
        source=string_batch(sources), target=string_batch(targets)).items()}
    return score_rows(out, alignment, alignment_layer)
  return batch
