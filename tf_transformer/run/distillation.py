"""Sequence-level knowledge distillation (Kim and Rush, 2016): a teacher
translates the training sources with its beam search, and a student trains
on those translations as its targets. The student (a deep encoder and a
shallow decoder, `ModelConfig.num_decoder_layers`) learns the teacher's
one mode of each source instead of the references' many, which a small
decoder fits better; it then serves far faster, since the decoder runs
once per output token and the encoder once per sentence.

    lines = distill(translator, "data/train.en", "student/train.distilled.de")

The teacher's translation of a corpus is long (millions of lines are the
normal case), so it is resumable as `bin/translate.py --resume` is: each
buffer of lines is sorted by length, translated in token batches and
written whole, and a stopped distillation goes on from the whole lines its
output holds.
"""

import os

from tf_transformer import command
from tf_transformer.data.corpora import line_windows
from tf_transformer.data.corpora import read_lines
from tf_transformer.progress import Progress
from tf_transformer.serving.output import one_line


def distill(translator, source_path, output_path, batch_tokens=2048,
            buffer_lines=10_000, progress_every_secs=10.0) -> int:
  """Writes the teacher's best translation of each line of `source_path`
  to `output_path`, line for line, resuming a stopped run.

  Args:
    translator: the teacher (`open_translator`'s: an export or a run).
    source_path: the training sources, one sentence a line.
    output_path: the distilled targets; the whole lines it holds are kept.
    batch_tokens: tokens a batch, padding included (sorted by length).
    buffer_lines: lines translated and written together.
    progress_every_secs: how often a progress line is logged (on a
      terminal, the line is rewritten in place).
  Returns:
    The lines translated now (0 where the output was whole already).
  Raises:
    ValueError where `output_path` holds more lines than the sources.
  """
  sources = read_lines(source_path)
  done = command.complete_lines(output_path)
  if done > len(sources):
    raise ValueError(f"{output_path} holds {done:,} lines, more than "
                     f"{source_path}'s {len(sources):,}: another corpus's")
  os.makedirs(os.path.dirname(os.path.abspath(output_path)), exist_ok=True)
  with Progress("distilled", len(sources) - done, "sentences",
                every_secs=progress_every_secs) as progress, \
      command.Output(output_path, append=True) as output:
    for _, lines in line_windows(sources, buffer_lines, done):
      translated = translator.translate(lines, 1, 1_000_000, progress,
                                        batch_tokens=batch_tokens)
      output.write([one_line(nbest[0][0]) for nbest in translated])
  return len(sources) - done
