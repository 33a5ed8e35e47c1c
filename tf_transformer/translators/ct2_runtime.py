"""Translating with a CTranslate2 export (`interop/ct2.py`): the same
text -> pieces -> search -> text contract as the SavedModel's `nbest`
signature, run by CTranslate2's C++ engine.

The search follows the export's `DecodingOptions`. These settings make
CTranslate2's search return what ours returns:
- it forbids EOS at the first step by default (`min_decoding_length=1`), by
  masking the logit before its softmax: the first token's log-probability is
  then renormalized over the rest of the vocabulary, so every score came out
  higher than ours by -log(1 - P(EOS at step 0)) / the length penalty, and an
  empty translation, which ours may return, could not be found. So
  `min_decoding_length=0` (the export's `min_length`, 0 unless asked),
  the same search space and the model's own log-probabilities;
- it normalizes a hypothesis' log-probability by |Y|^alpha, ours (GNMT's)
  by ((5 + |Y|) / 6)^alpha, and returns only its best `num_hypotheses` by its
  own: it is asked for every hypothesis it finished (`beam_size * patience`),
  which are re-ranked by ours, and their scores converted, log P(Y|X) /
  ((5 + |Y|) / 6)^alpha with |Y| counting the EOS (an output ended by the
  length limit has none), so scores mean the same whichever export made
  them;
- it stops a sentence once `beam_size` hypotheses have finished, where ours
  goes on while a live hypothesis could still beat a finished one: so
  `patience=2` (search until 2 * beam_size have finished; CTranslate2's
  option from Kasai et al., 2022);
- our output limit is per sentence: its source subwords + EOS +
  `max_decode_length_offset` tokens, EOS included, and an output that reaches
  it ends there without one. CTranslate2's `max_decoding_length` counts the
  same tokens, but per batch: it is the batch's longest limit.

What stays different, each a rule of CTranslate2's search (measured on the
test suite's numbers models in tests/test_ct2_export.py):
- it finishes a hypothesis only when its EOS ranks among the `beam_size`
  best candidates of a step; ours (TF Model Garden's rule) also finishes the
  EOS candidates ranked beam_size + 1 to 2 * beam_size, so it may return a
  better-scoring translation that CTranslate2 never finished;
- its stopping rule (above), and PAD and BOS, which ours never outputs
  (`special_ids.NEVER_OUTPUT`) and CTranslate2 may (its `suppress_sequences`
  would renormalize every step, as its EOS ban does);
- in a batch, a sentence whose output runs into its own limit (a repeating,
  undertrained output) may run on to the batch's longest limit;
- with `min_length` or `no_repeat_ngram_size` (both passed on), it
  renormalizes each step over the tokens not banned, where ours keeps the
  model's probabilities (`decoding/bans.py`): its scores are then higher,
  and its beams may rank differently.
"""

import dataclasses
import json
import os

import sentencepiece as spm

from tf_transformer.data import marian_vocabulary
from tf_transformer.data import vocabulary as vocabulary_lib
from tf_transformer.decoding import alignment as alignment_lib
from tf_transformer.decoding.search import DecodingOptions
from tf_transformer.interop.ct2 import DECODING_FILE
from tf_transformer.interop.ct2 import MODEL_FILE
from tf_transformer.interop.ct2 import VMAP_FILE
from tf_transformer.interop.ct2 import import_ctranslate2
from tf_transformer.interop.ct2 import is_ct2_model

PATIENCE = 2  # see the module docstring


class _SentencePiece:
  """Text <-> pieces by one SentencePiece model, both languages (what
  `MarianPieces` is for an imported Marian model)."""

  def __init__(self, model_file):
    self.processor = spm.SentencePieceProcessor(model_file=model_file)

  def source(self, texts):
    return self.processor.encode(list(texts), out_type=str)

  target = source

  def decode(self, pieces):
    return self.processor.decode(pieces)


def gnmt_penalty(length, alpha):
  """GNMT's lp(Y) = ((5 + |Y|) / 6)^alpha, as `beam_search.length_penalty`."""
  return ((5.0 + length) / 6.0) ** alpha


class CT2Decoder:
  """`nbest(texts) -> (translations [n][nbest] bytes, scores [n][nbest])`,
  as the SavedModel's `nbest` signature returns them, and the export's
  other services (prefixes, scoring) by CTranslate2.

  Args:
    path: a CTranslate2 export (bin/export.py --format=ctranslate2).
    compute_type: CTranslate2's ("int8" quantizes at load).
    intra_threads: its threads a batch; 0: its default.
  """

  def __init__(self, path, compute_type="default", intra_threads=0):
    ctranslate2 = import_ctranslate2()
    if not is_ct2_model(path):
      raise FileNotFoundError(f"{path}: not a CTranslate2 model (no "
                              f"{MODEL_FILE})")
    with open(os.path.join(path, DECODING_FILE), encoding="utf-8") as f:
      saved = json.load(f)
    unknown = set(saved["decoding"]) - {
        field.name for field in dataclasses.fields(DecodingOptions)}
    if unknown:
      raise ValueError(f"{path}: an export of a release before 1.0 (its "
                       f"{DECODING_FILE} has {', '.join(sorted(unknown))}): "
                       "export it again")
    self.options = DecodingOptions(**saved["decoding"])
    self.max_input_tokens = saved["max_input_tokens"]
    # Whether CTranslate2 ends each source with EOS (`add_source_eos`).
    self.source_eos = saved.get("source_eos", True)
    # The decoder layer (from 1) whose heads-averaged attention CTranslate2
    # returns; None in exports made before alignments (it returns the last
    # layer's first head there).
    self.alignment_layer = saved.get("alignment_layer")
    self.path = path
    self.nbest_size = self.options.nbest
    self.processor = (
        marian_vocabulary.MarianPieces.from_folder(
            os.path.join(path, marian_vocabulary.FOLDER))
        if marian_vocabulary.is_marian(path) else _SentencePiece(
            os.path.join(path, vocabulary_lib.FILENAME)))
    self.translator = ctranslate2.Translator(
        path, device="cpu", compute_type=compute_type,
        intra_threads=intra_threads)
    # An export with --shortlist: its table as CTranslate2's vocabulary map.
    self.use_vmap = os.path.exists(os.path.join(path, VMAP_FILE))

  def pieces(self, texts):
    """The source pieces CTranslate2 is given.

    Args:
      texts: source strings.
    Returns:
      Each text's subwords, cut to the input limit (the EOS is
      CTranslate2's to add: `add_source_eos`).
    """
    return [p[:self.max_input_tokens]
            for p in self.processor.source(texts)]

  def count_input_tokens(self, texts):
    """What `Translator.input_warnings` needs.

    Args:
      texts: source strings.
    Returns:
      (subwords per text before the cut, the input limit).
    """
    return ([len(p) for p in self.processor.source(texts)],
            self.max_input_tokens)

  def output_limit(self, sources):
    """The output limit of a batch (module docstring).

    Args:
      sources: the batch's source pieces.
    Returns:
      The most tokens an output may have, EOS included: the longest source
      + its EOS (where it has one) + the offset.
    """
    return (max([len(s) for s in sources], default=0) + int(self.source_eos)
            + self.options.max_decode_length_offset)

  def search_kwargs(self, sources):
    """`translate_batch`'s arguments for the export's `DecodingOptions`
    (module docstring) and a batch of source pieces."""
    o = self.options
    limit = self.output_limit(sources)
    kwargs = dict(num_hypotheses=o.nbest, return_scores=True,
                  max_input_length=0, length_penalty=o.length_penalty_alpha,
                  # 0 unless asked: see the module docstring; past the
                  # limit, outputs end at it, as the SavedModel's do
                  # (CTranslate2 refuses a minimum above its maximum)
                  min_decoding_length=min(o.min_length, limit),
                  no_repeat_ngram_size=o.no_repeat_ngram_size,
                  max_decoding_length=limit,
                  use_vmap=self.use_vmap)
    if o.method == "beam":
      # Every hypothesis it finishes, to be ranked by ours.
      kwargs.update(beam_size=o.beam_size, patience=PATIENCE,
                    num_hypotheses=round(o.beam_size * PATIENCE))
    elif o.method == "greedy":
      kwargs.update(beam_size=1)
    else:
      kwargs.update(beam_size=1, sampling_topk=o.top_k,
                    sampling_topp=o.top_p,
                    sampling_temperature=o.temperature)
    return kwargs

  def translate_pieces(self, sources):
    """CTranslate2's results (`TranslationResult`s) for lists of source
    pieces, one a source."""
    return self.translator.translate_batch(sources,
                                           **self.search_kwargs(sources))

  def ranked(self, result, limit):
    """One result's hypotheses ranked by our score (module docstring).

    Args:
      result: a CTranslate2 `TranslationResult`.
      limit: the batch's `output_limit`.
    Returns:
      [(pieces, log P(Y|X) / lp(Y))], best first.
    """
    return [(result.hypotheses[i], score)
            for i, score in self._ranked_indices(result, limit)]

  def _ranked_indices(self, result, limit):
    """`ranked`'s order as [(index into result.hypotheses, our score)]."""
    alpha = self.options.length_penalty_alpha
    ranked = []
    for index, (hypothesis, score) in enumerate(zip(result.hypotheses,
                                                    result.scores)):
      # |Y| counts the EOS, unless the limit ended the output.
      length = len(hypothesis) + (len(hypothesis) < limit)
      log_prob = score * length ** alpha
      ranked.append((index, log_prob / gnmt_penalty(length, alpha)))
    return sorted(ranked, key=lambda pair: -pair[1])

  def nbest(self, texts):
    """The SavedModel's `nbest` signature, by CTranslate2.

    Args:
      texts: source strings.
    Returns:
      (translations [n][nbest] UTF-8 bytes, scores [n][nbest]), best first.
    """
    sources = self.pieces(texts)
    results = self.translate_pieces(sources) if sources else []
    limit = self.output_limit(sources)
    translations, scores = [], []
    for result in results:
      best = self.ranked(result, limit)[:self.nbest_size]
      translations.append([self.processor.decode(h).encode("utf-8")
                           for h, _ in best])
      scores.append([score for _, score in best])
    return translations, scores

  def aligned(self, texts, layer=None):
    """The best translation of each text with its word alignment, as
    `Translator.translate_aligned` gives them from the SavedModel's
    `alignment` signature: `best_with_attention` made into word pairs by
    `decoding/alignment.py`.

    Args:
      texts: source strings.
      layer: the decoder layer asked for (from 1), or None: the export's.
    Returns:
      [(translation, score, Pharaoh pairs "i-j")], one a text. Raises
      ValueError naming the flag where this export cannot give them.
    """
    self._check_alignment_layer(layer)
    return [(self.processor.decode(target), score,
             _pairs(source, target, weights))
            for source, target, score, weights in self.best_with_attention(
                texts)]

  def _check_alignment_layer(self, layer):
    """Raises ValueError naming the flag unless this export's attention
    is decoder layer `layer`'s (None: whichever it kept)."""
    if self.alignment_layer is None:
      raise ValueError(f"--alignment: {self.path} was exported before "
                       "CTranslate2 exports kept the attention alignments "
                       "need: export it again")
    if layer is not None and layer != self.alignment_layer:
      raise ValueError(
          f"--alignment_layer={layer}: this CTranslate2 export returns the "
          f"attention of decoder layer {self.alignment_layer} only "
          "(CTranslate2 keeps one layer's, chosen at export: bin/export.py "
          f"--format=ctranslate2 --alignment_layer={layer})")

  def forced_alignments(self, texts, targets, layer=None):
    """Given translations' token log-probabilities and word alignments, as
    the SavedModel's `forced_alignment` signature gives them: the
    log-probabilities by `score_batch` (`token_log_probs`), the pairs from
    `forced_attention`.

    Args:
      texts, targets: source and target strings, one target a text.
      layer: as `aligned`'s.
    Returns:
      [([each target piece's and the EOS's log-prob], Pharaoh pairs)], one
      a text.
    """
    self._check_alignment_layer(layer)
    # Each side tokenized once, for the scores and the attention alike.
    sources, prefixes = self.pieces(texts), self._target_pieces(targets)
    return [(values, _pairs(source, target, weights))
            for values, (source, target, weights) in zip(
                self._scored(sources, prefixes),
                self._forced(sources, prefixes))]

  def forced_attention(self, texts, targets):
    """The export's alignment layer's attention, heads averaged, over given
    targets: a greedy `translate_batch` forced through each target as its
    prefix, whose rows at the prefix's pieces are the teacher-forced ones.
    With a shortlist's vocabulary map, as the export's searches run (the
    forced pieces need not be in it; the attention does not depend on it).

    Args:
      texts, targets: source and target strings, one target a text;
        targets cut as `token_log_probs` cuts them.
    Returns:
      [(source pieces, target pieces, attention [T][S])], one a text: a
      row for each target piece (none for its EOS), a column for each
      source piece (none for the source EOS).
    """
    return self._forced(self.pieces(texts), self._target_pieces(targets))

  def _forced(self, sources, prefixes):
    """`forced_attention` of source and target pieces, both already cut."""
    if not sources:
      return []
    results = self.translator.translate_batch(
        sources, target_prefix=prefixes, beam_size=1, return_attention=True,
        max_input_length=0, min_decoding_length=0,
        max_decoding_length=max(len(p) for p in prefixes) + 1,
        use_vmap=self.use_vmap)
    return [(source, prefix, result.attention[0][:len(prefix)])
            for source, prefix, result in zip(sources, prefixes, results)]

  def best_with_attention(self, texts):
    """The same search as `nbest`, with CTranslate2's `return_attention`:
    the export's alignment layer (`interop/ct2.py`), heads averaged.

    Args:
      texts: source strings.
    Returns:
      [(source pieces, best translation's pieces, its score, attention
      [T][S])], one a text: a row for each translation piece (none for its
      EOS), a column for each source piece (none for the source EOS).
    """
    sources = self.pieces(texts)
    if not sources:
      return []
    results = self.translator.translate_batch(
        sources, return_attention=True, **self.search_kwargs(sources))
    limit = self.output_limit(sources)
    first_rows = self._first_attention_rows(sources)
    best = []
    for i, (source, result) in enumerate(zip(sources, results)):
      index, score = self._ranked_indices(result, limit)[0]
      weights = result.attention[index]
      if weights and first_rows:  # row 0 replaced, the others shared
        weights = [list(first_rows[i])] + list(weights[1:])
      best.append((source, result.hypotheses[index], score, weights))
    return best

  def _first_attention_rows(self, sources):
    """Each source's attention at the first output step where CTranslate2's
    own is wrong, else None.

    CTranslate2 (4.8) returns, in a beam search over a batch of several
    sentences, one sentence's attention at the first step for every
    sentence (the later steps' are right; docs/decoding.md). The first
    step depends on nothing the search chose (the decoder sees only its
    start token), so a one-step greedy search gives each sentence's own.

    Args:
      sources: the batch's source pieces.
    Returns:
      [batch] rows [S], or None (sampling, greedy or a batch of one).
    """
    if self.options.method != "beam" or len(sources) < 2:
      return None
    # At least one token (no EOS at step 0), so the row is always returned.
    results = self.translator.translate_batch(
        sources, beam_size=1, max_decoding_length=1, min_decoding_length=1,
        max_input_length=0, return_attention=True)
    return [result.attention[0][0] for result in results]

  def prefix_pieces(self, texts, prefixes):
    """The best output of each text that starts with its prefix
    (CTranslate2's `target_prefix`).

    Args:
      texts, prefixes: source and target strings, one prefix a text.
    Returns:
      [(pieces, score)], scored as `nbest` scores.
    """
    sources = self.pieces(texts)
    if not sources:
      return []
    longest = self.max_input_tokens + self.options.max_decode_length_offset
    forced = [p[:longest] for p in self.processor.target(prefixes)]
    results = self.translator.translate_batch(
        sources, target_prefix=forced, **self.search_kwargs(sources))
    limit = self.output_limit(sources)
    return [self.ranked(result, limit)[0] for result in results]

  def translate_with_prefix(self, texts, prefixes):
    """The SavedModel's `translate_with_prefix` signature, by CTranslate2.

    Args:
      texts, prefixes: source and target strings, one prefix a text.
    Returns:
      (best translations as UTF-8 bytes, their scores).
    """
    best = self.prefix_pieces(texts, prefixes)
    return ([self.processor.decode(h).encode("utf-8") for h, _ in best],
            [score for _, score in best])

  def token_log_probs(self, texts, targets):
    """Forced decoding by CTranslate2's `score_batch`.

    Args:
      texts, targets: source and target strings, one target a text; targets
        are cut to the longest output the search gives, as the SavedModel's
        `score` signature cuts them.
    Returns:
      Per text, log P(y_t | y_<t, X) of each target piece and of the EOS.
    """
    return self._scored(self.pieces(texts), self._target_pieces(targets))

  def _scored(self, sources, targets):
    """`token_log_probs` of source and target pieces, both already cut."""
    results = self.translator.score_batch(sources, targets,
                                          max_input_length=0)
    return [list(r.log_probs) for r in results]

  def _target_pieces(self, targets):
    """Each target's pieces, cut to the longest output the search gives, as
    the SavedModel's `score` signature cuts them."""
    longest = self.max_input_tokens + self.options.max_decode_length_offset
    return [p[:longest] for p in self.processor.target(targets)]


def _pairs(source, target, weights):
  """One sentence's Pharaoh word pairs from its pieces (str) and attention
  rows (`decoding/alignment.hard_alignment`)."""
  return alignment_lib.pharaoh(alignment_lib.hard_alignment(
      weights, [p.encode("utf-8") for p in source],
      [p.encode("utf-8") for p in target]))
