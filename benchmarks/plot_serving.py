#!/usr/bin/env python3
r"""Draws test BLEU against one sentence's CPU time for each decoder and
search of one or more serving reports of `benchmarks/benchmark.py
--sections=serving`, one colour a model (a label may name several
reports): the picture of docs/performance.md.

  benchmarks/plot_serving.py --reports=teacher.json,student.json \
      --labels=teacher,student --output=docs/images/bleu_against_cpu_ms.png
"""

from absl import app
from absl import flags

from bench import serving_plot
from tf_transformer import command

FLAGS = flags.FLAGS
flags.DEFINE_list("reports", None, "benchmark.py --output files with a "
                  "serving section, one a model.")
flags.DEFINE_list("labels", None, "The models' names, one a report (the "
                  "same name for reports of one model).")
flags.DEFINE_string("output", "bleu_against_cpu_ms.png", "The PNG written.")
flags.DEFINE_string("title", "", "The picture's title.")
flags.mark_flags_as_required(["reports", "labels"])


def main(argv):
  del argv
  if len(FLAGS.reports) != len(FLAGS.labels):
    raise app.UsageError(f"--labels: {len(FLAGS.labels)} names for "
                         f"{len(FLAGS.reports)} --reports")
  points = serving_plot.points(list(zip(FLAGS.labels, FLAGS.reports)))
  serving_plot.draw(points, FLAGS.output, FLAGS.title)
  for point in points:
    print(f"{point.model:>12}  {point.decoder:<32} {point.cpu_ms:7.1f} ms  "
          f"BLEU {point.bleu:.2f}")
  print(f"wrote {FLAGS.output}")


if __name__ == "__main__":
  command.run(main, tensorflow=False)
