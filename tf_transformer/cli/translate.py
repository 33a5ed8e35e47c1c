"""Translates sentences, one per line, from stdin or --input.

  echo "four hundred and twenty-one" | bin/translate.py --model=saved_models/numbers/1
  bin/translate.py --model=/tmp/numbers_avg --input=src.txt --output=out.txt

With --nbest=N, each input gets N lines `INDEX ||| TRANSLATION ||| SCORE`.
With --target_prefix=F (one prefix a line, line-aligned with the input; an
empty line for none), each translation starts with its prefix and the same
search completes it:

  bin/translate.py --model=saved_models/numbers/1 --input=src.txt --target_prefix=prefixes.txt

With --alignment, each line is `TRANSLATION ||| 0-0 1-2 ...`: pairs of
source and translation words (from 0, split at whitespace) that the
decoder's attention aligns, as Marian's --alignment prints them
(docs/decoding.md#word-alignments).

Lines are read, sorted and translated --buffer_lines at a time (10,000),
each buffer's translations written and flushed before the next is read; at
a terminal, each line is translated as it is typed.
"""

import contextlib
import sys

from absl import flags

from tf_transformer import command
from tf_transformer.data.corpora import check_line_aligned
from tf_transformer.data.corpora import read_lines
from tf_transformer.data.errors import DataError
from tf_transformer.run import translator_flags
from tf_transformer.serving.output import aligned_lines
from tf_transformer.serving.output import output_lines
from tf_transformer.progress import Progress

FLAGS = flags.FLAGS
translator_flags.define_flags()
flags.DEFINE_string("input", None, "Input file (default: stdin).")
flags.DEFINE_string("output", None, "Output file (default: stdout).")
flags.DEFINE_integer("nbest", 1, "Translations per sentence.")
flags.DEFINE_string("target_prefix", None, "A file of target prefixes, "
                    "one a line for each input line (empty: none): each "
                    "translation starts with its prefix's subwords, and "
                    "the search completes it (autocompletion, post-editing).")
translator_flags.define_buffer_flag(
    terminal=" Stdin is read a buffer at a time, as it comes; where it is "
    "a terminal the default is 1 (a line is translated when typed).")
flags.DEFINE_bool("show_scores", False, "Prefix each translation with its "
                  "score and a tab.")
flags.DEFINE_bool("resume", False, "Keep the whole lines --output holds (a "
                  "stopped run's; a last line cut short is dropped), skip "
                  "as many lines of --input and append the rest: a long "
                  "translation, such as a teacher's of a training corpus, "
                  "goes on where it stopped and loses no line.")
flags.register_multi_flags_validator(
    ["resume", "input", "output", "nbest"],
    lambda f: not f["resume"] or (f["input"] and f["output"]
                                  and f["nbest"] == 1),
    "--resume: needs --input and --output files, one translation a line "
    "(--nbest=1)")
translator_flags.define_alignment_flags("SavedModel and CTranslate2 "
                                        "exports, runs")
flags.register_multi_flags_validator(
    ["alignment", "nbest", "target_prefix"],
    lambda f: not f["alignment"] or (f["nbest"] == 1
                                     and not f["target_prefix"]),
    "--alignment: one translation a line, without --target_prefix "
    "(--nbest=1)")


def main(argv):
  del argv
  try:
    prefixes = (read_lines(FLAGS.target_prefix) if FLAGS.target_prefix
                else None)
    done = command.complete_lines(FLAGS.output) if FLAGS.resume else 0
    given = translator_flags.input_buffers(FLAGS.input,
                                           whole=prefixes is not None,
                                           skip=done)
    texts = given.lines or []
    name = f"--input={FLAGS.input}" if FLAGS.input else "stdin"
    if done > len(texts):
      raise ValueError(f"--resume: --output={FLAGS.output} holds {done:,} "
                       f"lines, more than {name}'s {len(texts):,}: another "
                       "input's translation")
    if FLAGS.resume:
      print(f"translate: --resume: {FLAGS.output} holds {done:,} of "
            f"{len(texts):,} lines; translating the rest", file=sys.stderr)
    if prefixes is not None:
      check_line_aligned(prefixes, texts, (
          f"--target_prefix={FLAGS.target_prefix}", FLAGS.input or "stdin"))
    translator_flags.check_model_flags()
    command.import_tensorflow_quietly()  # after what needs no model
    translator = translator_flags.make_translator()

    def warnings(texts, first):
      for warning in translator.input_warnings(texts, name, first=first):
        print(f"translate: warning: {warning}", file=sys.stderr)
    if given.lines is not None:
      warnings(texts[done:], done + 1)
    with (contextlib.nullcontext() if given.interactive else Progress(
        "translated", len(texts) - done or None, "sentences")) as progress, \
        command.Output(FLAGS.output, append=FLAGS.resume) as output:
      for first, lines in given.buffers:
        if given.lines is None:
          warnings(lines, first)
        output.write(_translated(translator, lines, first, progress,
                                 prefixes))
  except DataError as e:
    return command.fail("translate", e, 2)
  except (OSError, ValueError, ImportError) as e:
    return command.fail("translate", e, 1)
  return 0


def _translated(translator, texts, first, progress, prefixes):
  """The output lines of one window of input lines, from line `first`."""
  batch_size, batch_tokens = translator_flags.batching()
  if FLAGS.alignment:
    return aligned_lines(translator.translate_aligned(
        texts, FLAGS.alignment_layer, batch_size, progress, batch_tokens),
                         FLAGS.show_scores)
  if prefixes is not None:
    prefixes = prefixes[first - 1:first - 1 + len(texts)]
  return output_lines(translator.translate(
      texts, FLAGS.nbest, batch_size, progress, prefixes, batch_tokens),
                      FLAGS.nbest > 1, FLAGS.show_scores, first - 1)


def _kept():
  """What a full disk left: (--output's lines before, --output)."""
  if not FLAGS.output:
    return None, None
  return (f"{FLAGS.output} holds the lines written before; rerun with "
          "--resume to go on from them", FLAGS.output)


def run():
  """`tf-transformer-translate`: parses the flags, then runs `main`."""
  command.run(main, tensorflow=False, kept=_kept)
