"""What the commands print for translations: one line each, n-best lines,
scores and word alignments (bin/translate.py, bin/evaluate.py,
bin/serving_client.py). Plain Python, without TensorFlow, so that a client
of TF Serving formats its answers without loading it."""


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
