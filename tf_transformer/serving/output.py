"""What the commands print for translations (one line each, n-best lines,
scores and word alignments: bin/translate.py, bin/evaluate.py,
bin/serving_client.py) and for scored pairs (bin/score.py,
bin/serving_client.py --target). Plain Python, without TensorFlow, so that
a client of TF Serving formats its answers without loading it."""

from tf_transformer.decoding import alignment as alignment_lib


def one_line(text):
  """A translation on one line.

  Args:
    text: a translation; a model can emit line breaks (byte fallback),
      which would shift every later line of a line-aligned file.
  Returns:
    `text` with its line breaks as spaces.
  """
  return " ".join(text.splitlines())


def output_lines(results, nbest_format, show_scores=False, start=0):
  """What bin/translate.py and bin/serving_client.py print.

  Args:
    results: [[(text, score), ...n-best], ...], one list an input.
    nbest_format: `INDEX ||| TEXT ||| SCORE` for every hypothesis.
    show_scores: else the best text, prefixed by `SCORE<TAB>`.
    start: the first input's INDEX.
  Returns:
    The lines, without line breaks.
  """
  lines = []
  for index, hypotheses in enumerate(results, start):
    if nbest_format:
      lines += [f"{index} ||| {one_line(t)} ||| {s:.4f}"
                for t, s in hypotheses]
    else:
      text, score = hypotheses[0]
      text = one_line(text)
      lines.append(f"{score:.4f}\t{text}" if show_scores else text)
  return lines


def aligned_lines(results, show_scores=False):
  """What bin/translate.py --alignment prints, as Marian does.

  Args:
    results: [(text, score, alignment), ...] (`Translator.translate_aligned`).
    show_scores: prefix each line with `SCORE<TAB>`.
  Returns:
    `TEXT ||| ALIGNMENT` lines, without line breaks.
  """
  return [(f"{score:.4f}\t" if show_scores else "")
          + f"{one_line(text)} ||| {pairs}" for text, score, pairs in results]


def score_rows(outputs, alignment=False, layer=None):
  """The results of a `score` (or, with `alignment`, `forced_alignment`)
  signature's outputs, one a pair.

  Args:
    outputs: {"log_prob" [batch], "token_log_probs" [batch, T], "lengths"
      [batch], and with `alignment` what `alignment.from_answer` reads}, as
      a SavedModel gives them (numpy) or TF Serving's REST API (lists).
    alignment: also make each pair's word alignment.
    layer: the decoder layer that aligns, from 1; None: the last.
  Returns:
    [(log_prob, [each scored token's log-prob])], with `alignment`
    [(log_prob, [...], Pharaoh string)].
  """
  rows = [(float(total), [float(v) for v in row[:int(length)]])
          for total, row, length in zip(
              outputs["log_prob"], outputs["token_log_probs"],
              outputs["lengths"])]
  if not alignment:
    return rows
  pairs = alignment_lib.from_answer(outputs, layer)
  return [row + (p,) for row, p in zip(rows, pairs)]


def score_line(log_prob, token_log_probs, with_tokens=False, pairs=None):
  """bin/score.py's line for one pair.

  Args:
    log_prob: log P(target | source).
    token_log_probs: each scored token's log-probability.
    with_tokens: also print those.
    pairs: the word alignment (Pharaoh pairs), printed last; None: none.
  Returns:
    `LOG_PROB<TAB>TOKENS[<TAB>per-token values][<TAB>alignment]`.
  """
  fields = [f"{log_prob:.4f}", str(len(token_log_probs))]
  if with_tokens:
    fields.append(" ".join(f"{v:.4f}" for v in token_log_probs))
  if pairs is not None:
    fields.append(pairs)
  return "\t".join(fields)


def score_lines(results, with_tokens=False):
  """bin/score.py's lines (`score_line`) for `Scorer.score`'s results,
  with their alignments where they have them."""
  return [score_line(r[0], r[1], with_tokens, *r[2:]) for r in results]
