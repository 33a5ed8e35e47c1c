#!/usr/bin/env python3
r"""Times the decoding step as one XLA program against the step the exports
run (benchmarks/bench/compiled_step.py; a synthetic micro-benchmark: random
weights, fixed tokens): CPU-ms a step of each way, with its ratio to the
graph step, and the largest logit difference from it.

  benchmarks/compiled_step.py --config=small_corpus --vocab_size=8000 \
      --batch_sizes=1,32 --beam_size=4 --threads=1
"""

import json

from absl import flags

from tf_transformer import command

FLAGS = flags.FLAGS
flags.DEFINE_string("config", "small_corpus", "Model preset.")
flags.DEFINE_string("hparams", "", "Config overrides.")
flags.DEFINE_integer("vocab_size", 8000, "Vocabulary size of the model.")
flags.DEFINE_list("batch_sizes", ["1", "32"], "Sentences a loop.")
flags.DEFINE_integer("beam_size", 4, "Rows a sentence.")
flags.DEFINE_integer("steps", 24, "Positions decoded a loop.")
flags.DEFINE_integer("max_length", 32, "Positions the cache holds.")
flags.DEFINE_integer("threads", 1, "TensorFlow's inter- and intra-op "
                     "threads.")
flags.DEFINE_integer("runs", 7, "Timed loops a round (median kept).")
flags.DEFINE_integer("rounds", 2, "Rounds, the ways alternating.")
flags.DEFINE_string("output", None, "Where the JSON goes.")


def main(argv):
  del argv
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tf_transformer import get_config  # pylint: disable=g-import-not-at-top
  from bench import compiled_step  # pylint: disable=g-import-not-at-top
  tf.config.threading.set_intra_op_parallelism_threads(FLAGS.threads)
  tf.config.threading.set_inter_op_parallelism_threads(FLAGS.threads)
  config = get_config(FLAGS.config, FLAGS.hparams,
                      vocab_size=FLAGS.vocab_size)
  figures = compiled_step.measure(
      config, [int(b) for b in FLAGS.batch_sizes], FLAGS.beam_size,
      FLAGS.steps, FLAGS.max_length, FLAGS.runs, FLAGS.rounds)
  print(f"{FLAGS.config}, {FLAGS.steps} steps, beam {FLAGS.beam_size}, "
        f"{FLAGS.threads} thread(s); CPU-ms a step (vs the graph step)")
  for batch in FLAGS.batch_sizes:
    cells = [f"{way} {f['cpu_ms_per_step']:.3f} ({f['vs_graph']:.2f}x)"
             for way, f in figures[f"batch_{batch}"].items()]
    print(f"batch {batch:>3}: " + "  ".join(cells))
  print("largest logit difference from the graph step: " + ", ".join(
      f"{way} {d:.2g}" for way, d in figures["max_abs_diff"].items()))
  if FLAGS.output:
    with open(FLAGS.output, "w", encoding="utf-8") as f:
      json.dump(figures, f, indent=1)
  return 0


if __name__ == "__main__":
  command.run(main, packages=("tf_transformer.", "bench."))
