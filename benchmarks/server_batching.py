#!/usr/bin/env python3
r"""What TF Serving's `--enable_batching` does for an export: concurrent
clients send one sentence a call to its serving_default, without batching
and under each batching setting, taking turns (the same batching op the
model server uses, in this process: benchmarks/bench/server_batching.py).

  benchmarks/server_batching.py --model=saved_models/multi30k/1 \
      --source=runs/multi30k/data/test_2016_flickr.en

Prints per round and setting: sentences/s, p50 and p99 latency, this
process's CPU-seconds, and the lines equal to the unbatched ones.
"""

import sys

from absl import app
from absl import flags

from tf_transformer import command
from tf_transformer.data.corpora import read_lines
from tf_transformer.data.errors import DataError

FLAGS = flags.FLAGS
flags.DEFINE_string("model", None, "A SavedModel version directory.")
flags.DEFINE_string("source", None, "Source sentences, one per line.")
flags.DEFINE_integer("sentences", 200, "Lines of --source used.", lower_bound=1)
flags.DEFINE_integer("clients", 8, "Concurrent callers.", lower_bound=1)
flags.DEFINE_integer("rounds", 2, "Timed rounds.", lower_bound=1)
flags.DEFINE_list("settings", ["1:0", "2:0", "2:2000"], "Batching settings "
                  "as BATCH_THREADS:BATCH_TIMEOUT_MICROS, after no batching.")
flags.DEFINE_integer("max_batch_size", 32, "max_batch_size of every setting.")
flags.DEFINE_integer("intra_threads", 1, "TensorFlow's intra-op threads.")
flags.DEFINE_integer("inter_threads", 2, "TensorFlow's inter-op threads (at "
                     "least 2: a batch waits on one).", lower_bound=2)
flags.mark_flags_as_required(["model", "source"])


def _settings(values, max_batch_size):
  from bench.server_batching import Setting  # pylint: disable=g-import-not-at-top
  settings = [Setting()]
  for value in values:
    try:
      threads, timeout = (int(v) for v in value.split(":"))
    except ValueError:
      raise app.UsageError(f"--settings: {value!r} is not "
                           "BATCH_THREADS:BATCH_TIMEOUT_MICROS") from None
    if threads < 1 or timeout < 0:
      raise app.UsageError(f"--settings: {value!r}: threads >= 1 and a "
                           "timeout >= 0")
    settings.append(Setting(threads, timeout, max_batch_size))
  return settings


def main(argv):
  del argv
  settings = _settings(FLAGS.settings, FLAGS.max_batch_size)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_text  # pylint: disable=g-import-not-at-top,unused-import
  from bench import server_batching  # pylint: disable=g-import-not-at-top
  tf.config.threading.set_intra_op_parallelism_threads(FLAGS.intra_threads)
  tf.config.threading.set_inter_op_parallelism_threads(FLAGS.inter_threads)
  try:
    sentences = read_lines(FLAGS.source)[:FLAGS.sentences]
  except DataError as e:
    print(f"server_batching: error: {e}", file=sys.stderr)
    return 2
  root = tf.saved_model.load(FLAGS.model)  # kept: the signature needs it
  serve = root.signatures["serving_default"]
  rows = server_batching.compare(
      lambda text: serve(text=text)["translation"], sentences, settings,
      FLAGS.clients, FLAGS.rounds)
  print(f"{len(sentences)} sentences, {FLAGS.clients} clients, one sentence "
        f"a call, {FLAGS.intra_threads} intra- / {FLAGS.inter_threads} "
        "inter-op threads")
  for r in rows:
    print(f"round {r['round']}  {r['setting']}: "
          f"{r['sentences_per_second']:.1f} sentences/s, p50 "
          f"{r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, "
          f"{r['cpu_seconds']:.2f} CPU-s, {r['same']}/{len(sentences)} "
          "lines as without batching")


if __name__ == "__main__":
  command.run(main, packages=("tf_transformer.", "bench."))
