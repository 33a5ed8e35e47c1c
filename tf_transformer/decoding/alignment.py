"""Word alignments from the encoder-decoder attention (section 3.2.3), in
the format of Marian's `--alignment` and the way of fairseq's
`--print-alignment`: where each output word came from, for carrying
markup, tags or terminology from a source line to its translation.

Each target subword is aligned to the source subword it attends to most
(the argmax over one decoder layer's attention, averaged over its heads;
the EOS of either side is left out), and the pairs of subwords become pairs
of whitespace-separated words: a SentencePiece piece that starts with "▁"
starts a word. A pair `i-j` (Pharaoh format, as fast_align writes it) says
that source word i and target word j, both from 0, are aligned.

The attention of a model trained without an alignment loss aligns words
only roughly, and which layer aligns best depends on the model: the last
by default here, as in fairseq; Garg et al. (2019, "Jointly Learning to
Align and Translate with Transformer Models") found the penultimate of six
best (docs/decoding.md#word-alignments has a measure on Multi30k).
"""

import numpy as np

WORD_START = "\u2581".encode("utf-8")  # SentencePiece's "▁"
EOS_PIECE = b"</s>"


def word_indices(pieces):
  """Each subword's word, from 0, as the detokenized line splits at
  whitespace.

  Args:
    pieces: one side's SentencePiece pieces (bytes), without EOS or
      padding.
  Returns:
    [len(pieces)] int: a piece that starts with "▁" starts the next word,
    the first piece with text starts word 0 whatever it starts with, and a
    piece with no text of its own (a lone "▁") is in no word: -1.
  """
  indices, word, new_word = [], -1, True
  for piece in pieces:
    new_word |= piece.startswith(WORD_START)
    if not piece.replace(WORD_START, b""):
      indices.append(-1)
      continue
    if new_word:
      word, new_word = word + 1, False
    indices.append(word)
  return np.array(indices, np.int64)


def _real(tokens):
  """The pieces of one padded side without padding ("") and EOS."""
  return [t for t in tokens if t and t != EOS_PIECE]


def hard_alignment(weights, source_tokens, target_tokens):
  """One sentence's word alignment.

  Args:
    weights: [T, S] one layer's encoder-decoder attention, heads averaged:
      row t is target subword t's distribution over the source subwords
      (rows and columns past the real pieces, EOS and padding, are not
      read, and may be absent: CTranslate2 gives none for the source EOS).
    source_tokens: [S] the source's pieces (bytes), EOS-terminated, ""
      as padding (or the pieces alone).
    target_tokens: [T] the translation's pieces, ending with "</s>", ""
      as padding (or the pieces alone).
  Returns:
    Sorted (source word, target word) pairs, each once: by target word,
    then source word, as Marian prints them.
  """
  source, target = _real(source_tokens), _real(target_tokens)
  source_words, target_words = word_indices(source), word_indices(target)
  if not target or not np.any(source_words >= 0):
    return []
  # The real pieces come first on both sides (EOS and padding follow);
  # pieces in no word never align.
  weights = np.asarray(weights, np.float64)[:len(target), :len(source)]
  aligned = np.argmax(np.where(source_words >= 0, weights, -np.inf), axis=1)
  pairs = {(int(source_words[s]), int(target_words[t]))
           for t, s in enumerate(aligned) if target_words[t] >= 0}
  return sorted(pairs, key=lambda pair: (pair[1], pair[0]))


def pharaoh(pairs):
  """`[(0, 0), (2, 1)]` -> "0-0 2-1"."""
  return " ".join(f"{s}-{t}" for s, t in pairs)


def from_attention(outputs, layer=None):
  """Alignments from an `alignment` or `attention` signature's outputs
  (numpy).

  Args:
    outputs: {"source_tokens": [batch, S], "target_tokens": [batch, T]
      (bytes), and "cross_attention": [batch, layers, T, S] (heads
      averaged; `alignment`) or "encoder_decoder": [batch, layers, heads,
      T, S] (`attention`)}.
    layer: the decoder layer, from 1; None: the last.
  Returns:
    [batch] Pharaoh strings ("" for an empty translation). Raises
    ValueError naming --alignment_layer if the model has no such layer.
  """
  if "cross_attention" in outputs:
    attention = np.asarray(outputs["cross_attention"])
  else:
    attention = np.asarray(outputs["encoder_decoder"]).mean(axis=2)
  num_layers = attention.shape[1]
  layer = num_layers if layer is None else layer
  if not 1 <= layer <= num_layers:
    raise ValueError(f"--alignment_layer={layer}: the model's decoder has "
                     f"layers 1 to {num_layers}")
  averaged = attention[:, layer - 1]  # [batch, T, S]
  return [pharaoh(hard_alignment(w, s, t)) for w, s, t in zip(
      averaged, outputs["source_tokens"], outputs["target_tokens"])]


def aligned(outputs, layer=None):
  """(translation, score, alignment) triples from an `alignment` (or
  `attention`) signature's outputs, as a SavedModel gives them (numpy) or
  TF Serving's REST API (nested lists, strings as str).

  Args:
    outputs: {"translation": [batch], "score": [batch], and what
      `from_attention` reads}.
    layer: as `from_attention`'s.
  Returns:
    [(translation str, score float, Pharaoh string)], one an input.
  """
  pairs = from_answer(outputs, layer)
  return [(_text(t), float(s), p) for t, s, p in zip(
      list(outputs["translation"]), list(outputs["score"]), pairs)]


def from_answer(outputs, layer=None):
  """`from_attention` of outputs as a SavedModel gives them (numpy) or TF
  Serving's REST API (nested lists, strings as str).

  Args:
    outputs: what `from_attention` reads, in either form.
    layer: as `from_attention`'s.
  Returns:
    [batch] Pharaoh strings.
  """
  tokens = {key: [[_bytes(p) for p in row] for row in outputs[key]]
            for key in ("source_tokens", "target_tokens")}
  weights = {key: np.asarray(outputs[key], np.float32)
             for key in ("cross_attention", "encoder_decoder")
             if key in outputs}
  return from_attention({**tokens, **weights}, layer)


def _bytes(value):
  return value if isinstance(value, bytes) else value.encode("utf-8")


def _text(value):
  return (value.decode("utf-8", "replace") if isinstance(value, bytes)
          else value)
