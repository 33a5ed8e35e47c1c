"""CPU time of a SavedModel export as a one-thread server spends it, and
the timing protocol that `benchmarks/benchmark.py --sections=serving` times
every decoder with, so that the student job's figures and the benchmark's
at `--threads=1` are one measurement:

- a process of its own, TensorFlow at one intra-op and one inter-op
  thread (`saved_model`), calling the export's `serving_default` signature
  on raw strings as TF Serving does; this module imports nothing but the
  standard library until it loads tensorflow and tensorflow_text, and
  oneDNN is on (tf_transformer's default; the benchmark's `savedmodel`
  row);
- one sentence a request (`latency`): WARMUP untimed passes over the same
  sentences (a warmed-up server: each new length builds its kernels once),
  then each call's CPU time; the figure is the middle call's (the
  benchmark's p50, `sorted[n // 2]`);
- batches of 32 in file order (`passes`): WARMUP untimed batches, then RUNS
  timed passes over all sentences; the figure is sentences over the median
  pass's CPU-seconds.
"""

import dataclasses
import gzip
import json
import os
import statistics
import subprocess
import sys
import time

LATENCY_SENTENCES = 100  # one-sentence requests timed
BATCH_SIZE = 32
RUNS = 3  # timed passes (benchmark.py --runs)
WARMUP = 2  # untimed passes or batches first (benchmark.py --warmup)


@dataclasses.dataclass
class Speed:
  one_sentence_ms: float  # the middle one-sentence request's CPU ms
  sentences_per_cpu_second: float  # at batch 32, the sources in file order


def measure(export, sources, latency_sentences=LATENCY_SENTENCES,
            runs=RUNS) -> Speed:
  """Times `export` (a SavedModel version) on the lines of the file
  `sources` in a fresh process, as the module's docstring says: one
  sentence a request over the first `latency_sentences`, batches of 32
  over all of them, `runs` timed passes. Raises RuntimeError with the
  process's error where it fails."""
  done = subprocess.run(
      [sys.executable, os.path.abspath(__file__), export, sources,
       str(latency_sentences), str(runs)],
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
               TF_ENABLE_ONEDNN_OPTS=os.environ.get("TF_ENABLE_ONEDNN_OPTS",
                                                    "1")),
      capture_output=True, text=True, check=False)
  if done.returncode:
    raise RuntimeError(f"timing {export} failed:\n{done.stderr[-2000:]}")
  return Speed(**json.loads(done.stdout.splitlines()[-1]))


def saved_model(model, threads=1, intra_threads=1, grappler=None):
  """`translate(texts) -> [translation]` over the SavedModel `model`'s
  serving_default signature, TensorFlow set to `threads` inter-op and
  `intra_threads` intra-op threads and the Grappler options `grappler`
  (as a server's session config sets them) before it loads."""
  # pylint: disable=g-import-not-at-top  (threads before TensorFlow starts)
  import tensorflow as tf
  import tensorflow_text  # noqa: F401  pylint: disable=unused-import
  tf.config.threading.set_intra_op_parallelism_threads(intra_threads)
  tf.config.threading.set_inter_op_parallelism_threads(threads)
  tf.config.optimizer.set_experimental_options(grappler or {})
  serve = tf.saved_model.load(model).signatures["serving_default"]

  def translate(texts):
    out = serve(text=tf.constant(texts, tf.string, shape=[len(texts)]))
    return [t.decode("utf-8") for t in out["translation"].numpy()]
  return translate


def passes(translate, sentences, batch_size, order, runs, warmup):
  """Seconds and CPU-seconds of each timed pass over `sentences`, and the
  outputs in file order, after `warmup` untimed calls of the first batch;
  `order` "sorted" batches the sentences by length (and puts the outputs
  back)."""
  indices = list(range(len(sentences)))
  if order == "sorted":
    indices.sort(key=lambda i: (len(sentences[i].split()),
                                len(sentences[i])))
  batches = [indices[i:i + batch_size]
             for i in range(0, len(indices), batch_size)]
  for _ in range(warmup):
    translate([sentences[i] for i in batches[0]])
  seconds, cpu_seconds, outputs = [], [], [None] * len(sentences)
  for _ in range(runs):
    start, cpu_start = time.perf_counter(), time.process_time()
    for batch in batches:
      for i, text in zip(batch, translate([sentences[i] for i in batch])):
        outputs[i] = text
    seconds.append(time.perf_counter() - start)
    cpu_seconds.append(time.process_time() - cpu_start)
  return seconds, cpu_seconds, outputs


def latency(translate, sentences, warmup):
  """Seconds and CPU-seconds of each one-sentence call, after `warmup`
  untimed passes over the same sentences (as a warmed-up server: an XLA
  export compiles once per request shape, and oneDNN builds its kernels
  once per shape, on its first request of that shape)."""
  for _ in range(warmup):
    for text in sentences:
      translate([text])
  seconds, cpu_seconds = [], []
  for text in sentences:
    start, cpu_start = time.perf_counter(), time.process_time()
    translate([text])
    seconds.append(time.perf_counter() - start)
    cpu_seconds.append(time.process_time() - cpu_start)
  return seconds, cpu_seconds


def _time(export, sources, latency_sentences, runs):
  """The timing itself, in this process."""
  opener = gzip.open if sources.endswith(".gz") else open
  with opener(sources, "rt", encoding="utf-8") as f:
    sentences = [line.rstrip("\n") for line in f]
  translate = saved_model(export)
  _, cpu_seconds, _ = passes(translate, sentences, BATCH_SIZE, "file", runs,
                             WARMUP)
  _, one = latency(translate, sentences[:latency_sentences], WARMUP)
  return Speed(1000 * statistics.median_high(one),
               len(sentences) / statistics.median(cpu_seconds))


if __name__ == "__main__":
  # The child: EXPORT SOURCES LATENCY_SENTENCES RUNS; the figures as one
  # JSON line.
  print(json.dumps(dataclasses.asdict(_time(
      sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))))
