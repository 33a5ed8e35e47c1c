"""The median wall time of a call, for the timed training step
(training/step_timing.py) and the benchmarks beside the package."""

import statistics
import time


def median_seconds(fn, runs=5, warmup=1):
  """Median wall time of `fn()` over `runs` calls after `warmup` untimed
  ones (tracing, XLA compilation, caches). `fn` must block until its work
  is done (e.g. read a result back with .numpy())."""
  for _ in range(warmup):
    fn()
  times = []
  for _ in range(runs):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times)
