"""CPU time of a SavedModel export as a one-thread server spends it: in a
process of its own with one intra-op and one inter-op thread, so that the
figures are the CPU-seconds of the decoding alone and compare with
CTranslate2's at one thread (`benchmarks/benchmark.py --sections=serving
--threads=1` measures the same way)."""

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time

LATENCY_SENTENCES = 100  # one-sentence requests timed
BATCH_SIZE = 32


@dataclasses.dataclass
class Speed:
  one_sentence_ms: float  # median CPU ms of a one-sentence request
  sentences_per_cpu_second: float  # at batch 32, the sources in file order


def measure(export, sources, latency_sentences=LATENCY_SENTENCES) -> Speed:
  """Times `export` (a SavedModel version) on the lines of the file
  `sources` in a fresh process: the median CPU time of one-sentence
  requests over the first `latency_sentences`, and sentences a CPU-second
  over all of them in batches of 32 in file order, each after a pass that
  traces the search's shapes. Raises RuntimeError with the process's
  error where it fails."""
  # The child imports this very package, wherever the working directory.
  root = os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))))
  code = (f"import sys; sys.path.insert(0, {root!r}); "
          f"from {__name__} import main; main(sys.argv[1:])")
  done = subprocess.run(
      [sys.executable, "-c", code, export, sources, str(latency_sentences)],
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), capture_output=True,
      text=True, check=False)
  if done.returncode:
    raise RuntimeError(f"timing {export} failed:\n{done.stderr[-2000:]}")
  return Speed(**json.loads(done.stdout.splitlines()[-1]))


def _time(export, sources, latency_sentences):
  """The timing itself, in this process (one thread)."""
  # pylint: disable=g-import-not-at-top  (threads before TensorFlow starts)
  import tensorflow as tf
  tf.config.threading.set_intra_op_parallelism_threads(1)
  tf.config.threading.set_inter_op_parallelism_threads(1)
  from tf_transformer.data.corpora import read_lines
  from tf_transformer.run import runner
  sentences = read_lines(sources)
  translator = runner.open_translator(model=export)
  translator.translate(sentences[:2 * BATCH_SIZE], 1, BATCH_SIZE)  # traces
  translator.translate(sentences[:1], 1, 1)
  times = []
  for sentence in sentences[:latency_sentences]:
    start = time.process_time()
    translator.translate([sentence], 1, 1)
    times.append(time.process_time() - start)
  start = time.process_time()
  translator.translate(sentences, 1, BATCH_SIZE)
  seconds = time.process_time() - start
  return Speed(1000 * statistics.median(times), len(sentences) / seconds)


def main(argv):
  """The child process: EXPORT SOURCES LATENCY_SENTENCES; prints the
  figures as one JSON line."""
  export, sources, latency_sentences = argv
  print(json.dumps(dataclasses.asdict(_time(export, sources,
                                            int(latency_sentences)))))
