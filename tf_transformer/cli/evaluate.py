"""Translates --source and scores it against --reference: sacrebleu BLEU and
chrF with their signatures (detokenized output, raw references), and exact
match; --paper_bleu adds the paper-style tokenized, compound-split score
under that name.

  bin/evaluate.py --model=saved_models/numbers/1 --source=test.en --reference=test.de
  bin/evaluate.py --model=... --source=test.en --reference=a.de --reference=b.de
"""

import sys

from absl import flags

from tf_transformer import command
from tf_transformer.data.corpora import check_line_aligned
from tf_transformer.data.corpora import read_lines
from tf_transformer.data.errors import DataError
from tf_transformer.run import translator_flags
from tf_transformer.serving.output import one_line
from tf_transformer.progress import Progress

FLAGS = flags.FLAGS
translator_flags.define_flags()
flags.DEFINE_string("source", None, "Source sentences, one per line.")
flags.DEFINE_multi_string(
    "reference", None, "Reference translations, line-aligned; repeated "
    "(--reference=a.de --reference=b.de), several references for each "
    "sentence, as sacrebleu takes them (exact match: equal to one).")
flags.DEFINE_string("output", None, "Also write the translations here.")
flags.DEFINE_bool("paper_bleu", False, "Also print the paper-style score.")
flags.mark_flags_as_required(["source", "reference"])


def main(argv):
  del argv
  try:
    sources = read_lines(FLAGS.source)
    references = [read_lines(path) for path in FLAGS.reference]
    names = (f"--source={FLAGS.source}",
             *(f"--reference={path}" for path in FLAGS.reference))
    for one, name in zip(references, names[1:]):
      check_line_aligned(sources, one, (names[0], name))
    translator_flags.check_model_flags()
    command.import_tensorflow_quietly()  # after what needs no model
    from tf_transformer.run import runner  # pylint: disable=g-import-not-at-top
    translator = translator_flags.make_translator()
    with Progress("translated", len(sources), "sentences") as progress:
      batch_size, batch_tokens = translator_flags.batching()
      result = runner.evaluate(
          translator, sources, references, batch_size,
          FLAGS.paper_bleu, progress, batch_tokens=batch_tokens,
          names=names)
  except DataError as e:
    return command.fail("evaluate", e, 2)
  except (OSError, ValueError, ImportError) as e:
    return command.fail("evaluate", e, 1)
  for warning in result.warnings:
    print(f"evaluate: warning: {warning}", file=sys.stderr)
  if FLAGS.output:
    with open(FLAGS.output, "w", encoding="utf-8") as f:
      f.write("".join(one_line(h) + "\n" for h in result.hypotheses))
  scores = result.scores
  print(f"BLEU = {scores['bleu']:.2f} ({scores['bleu_signature']})")
  print(f"chrF = {scores['chrf']:.2f} ({scores['chrf_signature']})")
  print(f"exact_match = {scores['exact_match']:.4f} ({len(sources)} "
        "sentences)")
  if FLAGS.paper_bleu:
    print(f"paper_bleu (tokenized, compound-split) = "
          f"{scores['paper_bleu']:.2f}")
  return 0


def run():
  """`tf-transformer-evaluate`: parses the flags, then runs `main`."""
  command.run(main, tensorflow=False)
