"""Translating with a CTranslate2 export (`serving/ct2_export.py`): the same
text -> pieces -> search -> text contract as the SavedModel's `nbest`
signature, run by CTranslate2's C++ engine.

The search follows the export's `DecodingOptions`. Three settings make
CTranslate2's beam search return what ours returns (the same best
hypothesis on 200 of 200 numbers-task lines, against 186 with its defaults):
- it forbids EOS at the first step by default (`min_decoding_length=1`), by
  masking the logit before its softmax: the first token's log-probability is
  then renormalized over the rest of the vocabulary, so every score came out
  higher than ours by -log(1 - P(EOS at step 0)) / the length penalty, and an
  empty translation, which ours may return, could not be found. The gap
  follows the model (8e-4 on one host's test model, 3.6e-3 on another's):
  so `min_decoding_length=0`, the same search space and the model's own
  log-probabilities;
- it normalizes a hypothesis' log-probability by |Y|^alpha, ours (GNMT's)
  by ((5 + |Y|) / 6)^alpha: the hypotheses it returns are re-ranked by ours,
  and their scores converted, log P(Y|X) / ((5 + |Y|) / 6)^alpha with |Y|
  counting the EOS, so scores mean the same whichever export made them;
- it stops a sentence once `beam_size` hypotheses have finished, where ours
  goes on while a live hypothesis could still beat a finished one: so
  `patience=2` (search until 2 * beam_size have finished; CTranslate2's
  option from Kasai et al., 2022).
"""

import json
import os

import numpy as np
import sentencepiece as spm

from tf_transformer.data import vocabulary as vocabulary_lib
from tf_transformer.decoding.search import DecodingOptions

DECODING_FILE = "tf_transformer.json"
MODEL_FILE = "model.bin"  # what tells a CTranslate2 directory apart
PATIENCE = 2  # see the module docstring


def is_ct2_model(path) -> bool:
  return os.path.isfile(os.path.join(path, MODEL_FILE))


def import_ctranslate2():
  try:
    import ctranslate2  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError("a CTranslate2 model needs the ctranslate2 package: "
                      'pip install -e ".[ctranslate2]"') from e
  return ctranslate2


def gnmt_penalty(length, alpha):
  return ((5.0 + length) / 6.0) ** alpha


class CT2Decoder:
  """`nbest(texts) -> (translations [n][nbest] bytes, scores [n][nbest])`,
  as the SavedModel's `nbest` signature returns them."""

  def __init__(self, path, compute_type="default", intra_threads=0):
    ctranslate2 = import_ctranslate2()
    if not is_ct2_model(path):
      raise FileNotFoundError(f"{path}: not a CTranslate2 model (no "
                              f"{MODEL_FILE})")
    with open(os.path.join(path, DECODING_FILE), encoding="utf-8") as f:
      saved = json.load(f)
    self.options = DecodingOptions.from_dict(saved["decoding"])
    self.max_input_tokens = saved["max_input_tokens"]
    self.nbest_size = self.options.nbest
    self.processor = spm.SentencePieceProcessor(
        model_file=os.path.join(path, vocabulary_lib.FILENAME))
    self.translator = ctranslate2.Translator(
        path, device="cpu", compute_type=compute_type,
        intra_threads=intra_threads)

  def pieces(self, texts):
    """Each text's subwords, cut to the input limit (the EOS is CTranslate2's
    to add: `add_source_eos`)."""
    return [p[:self.max_input_tokens]
            for p in self.processor.encode(list(texts), out_type=str)]

  def count_input_tokens(self, texts):
    """(subwords per text before the cut, the input limit)."""
    return ([len(p) for p in self.processor.encode(list(texts))],
            self.max_input_tokens)

  def search_kwargs(self, sources):
    o = self.options
    kwargs = dict(num_hypotheses=o.nbest, return_scores=True,
                  max_input_length=0, length_penalty=o.length_penalty_alpha,
                  min_decoding_length=0,  # see the module docstring
                  # Our limit is per sentence (source + EOS + offset, EOS
                  # included); CTranslate2's is per batch and excludes EOS.
                  max_decoding_length=max(
                      [len(s) for s in sources], default=0)
                  + o.max_decode_length_offset)
    if o.method == "beam":
      kwargs.update(beam_size=o.beam_size, patience=PATIENCE)
    elif o.method == "greedy":
      kwargs.update(beam_size=1)
    else:
      kwargs.update(beam_size=1, sampling_topk=o.top_k,
                    sampling_temperature=o.temperature)
    return kwargs

  def translate_pieces(self, sources):
    """CTranslate2's results for lists of source pieces."""
    return self.translator.translate_batch(sources,
                                           **self.search_kwargs(sources))

  def nbest(self, texts):
    sources = self.pieces(texts)
    results = self.translate_pieces(sources) if sources else []
    n = self.nbest_size
    translations, scores = [], []
    for result in results:
      row_texts, row_scores = [], []
      for hypothesis, score in zip(result.hypotheses, result.scores):
        length = len(hypothesis) + 1  # and the EOS
        alpha = self.options.length_penalty_alpha
        log_prob = score * length ** alpha
        row_texts.append(self.processor.decode(hypothesis).encode("utf-8"))
        row_scores.append(log_prob / gnmt_penalty(length, alpha))
      order = np.argsort(row_scores)[::-1]
      translations.append([row_texts[i] for i in order][:n])
      scores.append([row_scores[i] for i in order][:n])
    return translations, scores

  def translate_with_prefix(self, texts, prefixes):
    """(best translations, scores) that start with `prefixes`
    (CTranslate2's `target_prefix`), scored as `nbest` scores."""
    sources = self.pieces(texts)
    if not sources:
      return [], []
    longest = self.max_input_tokens + self.options.max_decode_length_offset
    forced = [p[:longest] for p in self.processor.encode(list(prefixes),
                                                         out_type=str)]
    kwargs = dict(self.search_kwargs(sources), num_hypotheses=1)
    results = self.translator.translate_batch(sources, target_prefix=forced,
                                              **kwargs)
    alpha = self.options.length_penalty_alpha
    translations, scores = [], []
    for result in results:
      hypothesis, score = result.hypotheses[0], result.scores[0]
      length = len(hypothesis) + 1  # and the EOS
      translations.append(self.processor.decode(hypothesis).encode("utf-8"))
      scores.append(score * length ** alpha / gnmt_penalty(length, alpha))
    return translations, scores

  def token_log_probs(self, texts, targets):
    """log P(y_t | y_<t, X) of each target piece and of the EOS, teacher
    forced (CTranslate2's `score_batch`); targets are cut to the longest
    output the search gives, as the SavedModel's `score` signature cuts
    them."""
    longest = self.max_input_tokens + self.options.max_decode_length_offset
    results = self.translator.score_batch(
        self.pieces(texts), [p[:longest] for p in self.processor.encode(
            list(targets), out_type=str)], max_input_length=0)
    return [list(r.log_probs) for r in results]
