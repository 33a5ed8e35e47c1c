"""Scores given translations: the log-probability the model gives each
target line for its source line (forced decoding), to rerank n-best lists,
filter noisy parallel data, or compare models on the same references.

  bin/score.py --model=saved_models/numbers/1 --source=test.en --target=test.de
  bin/score.py --model=/tmp/numbers_avg --source=src.txt --target=hyp.txt --tokens

--model is a SavedModel version (its `score` signature), a CTranslate2
directory (`score_batch`) or a run directory (its newest checkpoint). Each
line of output answers one pair: LOG_PROB<TAB>TOKENS, where LOG_PROB is
log P(target | source), natural log, summed over the target's subwords and
its end-of-sentence token under teacher forcing, with no length penalty,
and TOKENS is how many were scored; --tokens adds a third field, the
per-token values separated by spaces; --alignment a last field, the
pair's word alignment from the attention over the given target (Pharaoh
pairs "i-j", as `translate.py --alignment` and `marian-scorer --alignment`
print them; docs/decoding.md#word-alignments). Sources are cut to the
model's input limit and targets to input limit + max_length_offset
subwords, as translation cuts them. Pairs are scored in batches of like
length (--batch_tokens subwords a side, padding included, as translate.py
batches), and printed in input order, --buffer_lines pairs at a time.

Exit status: 0 scored; 1 bad flags or model; 2 bad input files (one line
naming them).
"""


from absl import flags

from tf_transformer import command
from tf_transformer.data.corpora import check_line_aligned
from tf_transformer.data.corpora import line_windows
from tf_transformer.data.corpora import read_lines
from tf_transformer.data.errors import DataError
from tf_transformer.progress import Progress
from tf_transformer.run import translator_flags
from tf_transformer.serving.output import score_lines

FLAGS = flags.FLAGS
flags.DEFINE_string("model", None, "A SavedModel version (NAME/VERSION), a "
                    "CTranslate2 directory, or a run directory.")
flags.DEFINE_string("source", None, "Source sentences, one per line.")
flags.DEFINE_string("target", None, "Their translations to score, "
                    "line-aligned.")
flags.DEFINE_string("output", None, "Output file (default: stdout).")
flags.DEFINE_bool("tokens", False, "Add each target token's log-probability "
                  "(its subwords', then the end-of-sentence token's).")
translator_flags.define_batching_flags(
    "Pairs", "subwords a side (a pair's longer side counts)")
flags.mark_flags_as_required(["model", "source", "target"])
translator_flags.define_buffer_flag("Pairs", "scored")
translator_flags.define_alignment_flags(
    "over each given target; SavedModel, CTranslate2 and run",
    added="Add each pair's word alignment as a last field")


def main(argv):
  del argv
  try:
    sources, targets = read_lines(FLAGS.source), read_lines(FLAGS.target)
    check_line_aligned(sources, targets, (f"--source={FLAGS.source}",
                                          f"--target={FLAGS.target}"))
    # TensorFlow after what needs no model.
    command.import_tensorflow_quietly()
    # pylint: disable=g-import-not-at-top
    from tf_transformer.run import runner
    scorer = runner.open_scorer(FLAGS.model, FLAGS.alignment,
                                FLAGS.alignment_layer)
    batch_size, batch_tokens = translator_flags.batching()
    with Progress("scored", len(sources), "pairs") as progress, \
        command.Output(FLAGS.output) as output:
      for first, buffer in line_windows(sources, FLAGS.buffer_lines):
        start = first - 1
        output.write(score_lines(scorer.score(
            buffer, targets[start:start + len(buffer)], batch_size,
            progress, batch_tokens), FLAGS.tokens))
  except DataError as e:
    return command.fail("score", e, 2)
  except (OSError, ValueError, ImportError) as e:
    return command.fail("score", e, 1)
  return 0


def _kept():
  """What a full disk left: (--output's lines before, --output)."""
  if not FLAGS.output:
    return None, None
  return (f"{FLAGS.output} holds the lines written before; rerun to write it "
          "whole", FLAGS.output)


def run():
  """`tf-transformer-score`: parses the flags, then runs `main`."""
  command.run(main, tensorflow=False, kept=_kept)
