"""Word alignments from the encoder-decoder attention
(`decoding/alignment.py`), on attention built by hand."""

import numpy as np
import pytest

from tf_transformer.decoding import alignment
from tf_transformer.serving.output import aligned_lines

W = "\u2581"


def pieces(*texts):
  return [t.replace("_", W).encode("utf-8") for t in texts]


def test_a_piece_with_the_word_mark_starts_a_word():
  # "_" stands for SentencePiece's "▁"; a lone "▁" (no text: in no word)
  # starts a word that the next piece holds; a first piece without it is
  # still word 0.
  assert alignment.word_indices(pieces("_a", "b", "_c", "_", "4")).tolist() \
      == [0, 0, 1, -1, 2]
  assert alignment.word_indices(pieces("x", "_y")).tolist() == [0, 1]
  assert alignment.word_indices([]).tolist() == []
  # A lone "▁" before a word that starts with its own: no word of its own
  # (the detokenized text has one word there, not two).
  assert alignment.word_indices(pieces("_", "_Hund", "_")).tolist() == [
      -1, 0, -1]


def test_each_target_subword_goes_to_its_most_attended_source_word():
  source = pieces("_the", "_black", "_do", "g", "</s>", "")  # 3 words
  target = pieces("_der", "_schwarz", "e", "_Hund", "</s>", "")  # 3 words
  weights = np.zeros([6, 6])
  weights[0, 0] = 1.0  # der -> the
  weights[1, 1] = 0.6  # schwarz -> black
  weights[1, 4] = 0.9  # ... over the source EOS, which never aligns
  weights[2, 1] = 1.0  # schwarz|e -> black: one pair, once
  weights[3, 3] = 0.5  # Hund -> do|g
  weights[4, 2] = 1.0  # the target EOS's row is left out
  assert alignment.hard_alignment(weights, source, target) == [
      (0, 0), (1, 1), (2, 2)]
  # Sorted by target word, then source word, as Marian prints them.
  weights[0] = [0, 0, 1, 0, 0, 0]  # der -> dog
  assert alignment.pharaoh(alignment.hard_alignment(
      weights, source, target)) == "2-0 1-1 2-2"


def test_an_empty_translation_has_no_pairs():
  weights = np.ones([2, 3])
  assert alignment.hard_alignment(
      weights, pieces("_a", "</s>", ""), pieces("</s>", "")) == []
  # A translation of a lone "▁" detokenizes to "": no word, no pair.
  assert alignment.hard_alignment(
      weights, pieces("_a", "</s>", ""), pieces("_", "</s>")) == []
  # CTranslate2 gives the pieces alone, and no rows for an empty output.
  assert alignment.hard_alignment([], pieces("_a"), []) == []
  assert alignment.hard_alignment([[1.0]], pieces("_a"), pieces("_x")) == [
      (0, 0)]


def test_pieces_in_no_word_never_align():
  source = pieces("_", "_a", "</s>")  # "▁" in no word; "▁a" is word 0
  target = pieces("_x", "_", "</s>")
  weights = np.array([[0.9, 0.1, 0.0], [0.0, 1.0, 0.0], [0, 0, 1.0]])
  assert alignment.hard_alignment(weights, source, target) == [(0, 0)]


def test_the_chosen_layer_aligns_with_its_heads_averaged():
  source = pieces("_a", "_b", "</s>")
  target = pieces("_x", "</s>")
  attention = np.zeros([1, 3, 2, 2, 3])  # [batch, layers, heads, T, S]
  attention[0, 0, :, 0, 0] = 1.0  # layer 1: x -> a
  attention[0, 1, 0, 0] = [0.45, 0.55, 0]  # layer 2: head 1 leans to b,
  attention[0, 1, 1, 0] = [0.9, 0.1, 0]  # head 2 to a; averaged: a
  attention[0, 2, :, 0, 1] = 1.0  # layer 3: x -> b
  outputs = {"encoder_decoder": attention,
             "source_tokens": np.array([source]),
             "target_tokens": np.array([target])}
  assert [alignment.from_attention(outputs, layer)
          for layer in (1, 2, 3, None)] == [["0-0"], ["0-0"], ["1-0"], ["1-0"]]
  for layer in (0, 4):
    with pytest.raises(ValueError, match=rf"--alignment_layer={layer}: the "
                       r"model's decoder has layers 1 to 3"):
      alignment.from_attention(outputs, layer)


def test_lines_and_exports_that_cannot_align():
  assert aligned_lines([("ein Hund\nläuft", -0.51234, "0-0 1-1 1-2")],
                       show_scores=True) == [
                           "-0.5123\tein Hund läuft ||| 0-0 1-1 1-2"]
