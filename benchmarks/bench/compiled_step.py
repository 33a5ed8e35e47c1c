"""The decoding step as one XLA program (a synthetic micro-benchmark):
`decoding/step.py` run for --steps positions inside a TensorFlow loop,
three ways, alternating: as the exports run it (graph kernels, the cache
growing by blocks), with every shape static (the cache's blocks all there
from the start, as XLA needs), and with that static step compiled by XLA on
its own (`tf.function(jit_compile=True)`), called from the same loop. Random
weights; the tokens fed are fixed, not searched, so that the three compute
the same logits."""

import statistics
import time

import tensorflow as tf

from tf_transformer import build_model
from tf_transformer.decoding import cache as cache_lib
from tf_transformer.decoding import step as step_lib

WAYS = (("graph", False, False), ("static", True, False),
        ("xla", True, True))


def loop(model, weights, memory, mask, group, steps, max_length, static,
         jit):
  """A `tf.function` that decodes `steps` positions of the sentences of
  `memory` (the encoder output, `mask` its real tokens), `group` rows each,
  with the step's `weights`, and returns the last step's logits
  [batch * group, vocab]."""
  vocab = model.config.model.vocab_size
  step = step_lib.Step(model, static=static)
  rows = memory.shape[0] * group
  core = lambda ids, t, cache: step(ids, t, cache, mask, weights)
  if jit:
    core = tf.function(core, jit_compile=True, autograph=False)

  @tf.function(autograph=False)
  def decode():
    cache = step.initial_cache(weights, memory, max_length, group)

    def body(t, cache, _):
      ids = (tf.range(rows)[:, tf.newaxis] * 7 + t * 13) % (vocab - 4) + 4
      logits, cache = core(ids, t, cache)
      return t + 1, cache, logits

    shapes = (tf.nest.map_structure(lambda x: x.shape, cache) if static
              else cache_lib.loop_shapes(cache))
    return tf.while_loop(
        lambda t, *_: t < steps, body,
        (tf.constant(0), cache, tf.zeros([rows, vocab])),
        shape_invariants=(tf.TensorShape([]), shapes,
                          tf.TensorShape([rows, vocab])))[2]
  return decode


def measure(config, batch_sizes, group, steps, max_length, runs=7,
            rounds=2):
  """CPU-ms a step of each way, for each batch size.

  Args:
    config: a `TransformerConfig` (random weights).
    batch_sizes: sentences a loop.
    group: rows a sentence (the beam).
    steps: positions decoded a loop.
    max_length: positions the cache holds (whole blocks of 16).
    runs: timed loops a round (the median is kept); rounds: alternations.
  Returns:
    {"batch_N": {way: {"cpu_ms_per_step", "vs_graph"}}, "max_abs_diff":
    {way: largest logit difference from the graph way}}.
  """
  model = build_model(config)
  model((tf.ones([1, 4], tf.int32), tf.ones([1, 4], tf.int32)))
  figures = {"max_abs_diff": {}}
  # The step's weights do not depend on the way (only its shapes do).
  weights = step_lib.read(step_lib.Step(model), None, max_length)
  for batch in batch_sizes:
    source = tf.random.stateless_uniform([batch, 16], [0, 1], 4,
                                         config.model.vocab_size, tf.int32)
    memory, mask = model.encode(source)
    loops = {name: loop(model, weights, memory, mask, group, steps,
                        max_length, static, jit)
             for name, static, jit in WAYS}
    logits = {name: fn().numpy() for name, fn in loops.items()}  # warm-up
    for name in loops:
      diff = float(abs(logits[name] - logits["graph"]).max())
      figures["max_abs_diff"][name] = max(
          diff, figures["max_abs_diff"].get(name, 0.0))
    seconds = {name: [] for name in loops}
    for _ in range(rounds):
      for name, fn in loops.items():
        times = []
        for _ in range(runs):
          start = time.process_time()
          fn().numpy()
          times.append(time.process_time() - start)
        seconds[name].append(statistics.median(times))
    best = {name: min(values) for name, values in seconds.items()}
    figures[f"batch_{batch}"] = {
        name: {"cpu_ms_per_step": best[name] * 1e3 / steps,
               "vs_graph": best[name] / best["graph"]} for name in loops}
  return figures
