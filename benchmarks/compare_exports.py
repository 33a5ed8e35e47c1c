#!/usr/bin/env python3
r"""Times SavedModels against each other on the same text, taking turns:
every pass of every export runs in a fresh process as a server runs it
(benchmarks/bench/serving_worker.py: tensorflow, tensorflow_text and
the timing protocol of tf_transformer/run/export_speed.py), the exports taking turns for --rounds rounds,
in the given order and then reversed, so that a host's drift reaches all
of them alike. Made for one model exported
by two versions of the code (old and new), or with two sets of options.

  benchmarks/compare_exports.py --exports=old=/tmp/old/1,new=/tmp/new/1 \
      --source=runs/multi30k/data/test_2016_flickr.en

Prints per export the median over rounds of: seconds of a pass over the
sentences at --batch_size in file order (with --threads=1, wall and CPU
time agree), CPU-seconds of a one-sentence call, and, from the first
round's profiler trace, the kernels a decoding step executes at batch 1 and
at --batch_size; each with its ratio to the first export's; and the lines
whose translation differs from the first export's.
"""

import json
import os
import statistics
import sys

from absl import app
from absl import flags

from tf_transformer import command
from tf_transformer.data.corpora import read_lines
from tf_transformer.data.errors import DataError

FLAGS = flags.FLAGS
flags.DEFINE_list("exports", None, "NAME=PATH of each SavedModel version "
                  "directory; ratios are to the first.")
flags.DEFINE_string("source", None, "Source sentences, one per line.")
flags.DEFINE_integer("sentences", 1000, "Lines of --source used.")
flags.DEFINE_integer("batch_size", 32, "Sentences per request.")
flags.DEFINE_integer("threads", 1, "TensorFlow's inter- and intra-op "
                     "threads.")
flags.DEFINE_integer("rounds", 3, "Timed passes of each export, alternating.")
flags.DEFINE_integer("latency_sentences", 100, "One-sentence calls timed a "
                     "round (0: none).")
flags.DEFINE_integer("profile_sentences", 10, "One-sentence requests traced "
                     "in the first round to count kernels (0: none).")
flags.DEFINE_string("output", None, "Where the JSON of every pass goes.")
flags.mark_flags_as_required(["exports", "source"])


def _exports():
  named = {}
  for item in FLAGS.exports:
    name, _, path = item.partition("=")
    if not path or not os.path.exists(os.path.join(path, "saved_model.pb")):
      raise app.UsageError(f"--exports: {item!r} is not NAME=PATH of a "
                           "SavedModel version directory (saved_model.pb)")
    named[name] = path
  return named


def _row(name, figures, first):
  ratio = lambda key: (f"{figures[key] / first[key]:.3f}x"
                       if first.get(key) else "-")
  cells = [f"{name:<14}"]
  for key, unit in (("pass", "s"), ("call_cpu", "s"),
                    ("kernels_batch_1", ""), ("kernels_batch_n", "")):
    if key in figures:
      cells.append(f"{key} {figures[key]:.4g}{unit} ({ratio(key)})")
  cells.append(f"lines unlike {next(iter(FLAGS.exports)).split('=')[0]}: "
               f"{figures['unlike']}")
  return "  ".join(cells)


def main(argv):
  del argv
  from bench import serving_speed  # pylint: disable=g-import-not-at-top
  exports = _exports()
  try:
    sentences = read_lines(FLAGS.source)[:FLAGS.sentences]
  except DataError as e:
    print(f"compare_exports: error: {e}", file=sys.stderr)
    return 2
  passes = {name: [] for name in exports}
  for round_index in range(FLAGS.rounds):
    # In turns both ways (ABBA...), so that drift within a round does not
    # always favour the export that runs first.
    order = list(exports.items())
    for name, path in order if round_index % 2 == 0 else order[::-1]:
      request = dict(
          kind="saved_model", model=path, sentences=sentences,
          threads=FLAGS.threads, intra_threads=FLAGS.threads, runs=1,
          warmup=1, batch_size=FLAGS.batch_size, orders=["file"],
          latency_sentences=FLAGS.latency_sentences, clients=0,
          profile_sentences=FLAGS.profile_sentences if round_index == 0
          else 0)
      print(f"round {round_index + 1}: {name} ...", file=sys.stderr,
            flush=True)
      passes[name].append(serving_speed._run_worker(request, {}))  # pylint: disable=protected-access
  figures = {}
  first_outputs = None
  for name, results in passes.items():
    outputs = results[0]["orders"]["file"]["outputs"]
    first_outputs = first_outputs or outputs
    figures[name] = {
        "pass": statistics.median(r["orders"]["file"]["seconds"][0]
                                  for r in results),
        "unlike": sum(a != b for a, b in zip(outputs, first_outputs))}
    if FLAGS.latency_sentences:
      figures[name]["call_cpu"] = statistics.median(
          statistics.median(r["latency_cpu_seconds"]) for r in results)
    kernels = results[0].get("kernels")
    if kernels:
      figures[name]["kernels_batch_1"] = kernels["batch_1"]["kernels_per_step"]
      figures[name]["kernels_batch_n"] = kernels[
          f"batch_{FLAGS.batch_size}"]["kernels_per_step"]
  first = next(iter(figures.values()))
  print(f"{len(sentences)} lines of {FLAGS.source}, batch "
        f"{FLAGS.batch_size}, {FLAGS.threads} thread(s), median of "
        f"{FLAGS.rounds} alternating rounds")
  for name, values in figures.items():
    print(_row(name, values, first))
  if FLAGS.output:
    with open(FLAGS.output, "w", encoding="utf-8") as f:
      json.dump({"figures": figures, "passes": passes}, f)
  return 0


if __name__ == "__main__":
  command.run(main, packages=("tf_transformer.", "bench."))
