"""The kernels a decoding step executes, counted from a TensorFlow profiler
trace: what ran, after Grappler fused and pruned the graph at load, not the
graph's nodes.

    trace(lambda: serve(text=...), logdir)
    counts = step_counts(executed_kernels(logdir))

A search's loop body runs once per decoding step: its kernels are those
whose op name holds "/while/body/", and the steps are the executions of the
body (for each loop, the count of its most frequent op; loops decoding parts
of a request at once are summed). Imports only TensorFlow (the serving
worker runs it beside a SavedModel, with nothing of tf_transformer loaded).
"""

import collections
import glob
import os
import typing

LOOP_BODY = "/while/body/"


class Kernel(typing.NamedTuple):
  name: str  # the op's name in the graph
  type: str  # the kernel's op type (e.g. _FusedMatMul after a rewrite)
  microseconds: float


def trace(fn, logdir):
  """Runs fn() under the TensorFlow profiler, writing to `logdir`. At
  host_tracer_level 3: at the default 2, the executor traces only the
  kernels its cost model still counts as expensive, so a warmed-up model's
  small kernels went missing from the count (111 a step instead of 340)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf.profiler.experimental.start(
      logdir, options=tf.profiler.experimental.ProfilerOptions(
          host_tracer_level=3))
  try:
    fn()
  finally:
    tf.profiler.experimental.stop()


def executed_kernels(logdir):
  """Every kernel the TensorFlow executor ran in the trace under
  `logdir`, in order."""
  # pylint: disable=g-import-not-at-top
  from tensorflow.tsl.profiler.protobuf import xplane_pb2
  paths = glob.glob(os.path.join(logdir, "plugins", "profile", "*",
                                 "*.xplane.pb"))
  if not paths:
    raise FileNotFoundError(f"no profiler trace under {logdir}")
  space = xplane_pb2.XSpace()
  with open(paths[0], "rb") as f:
    space.ParseFromString(f.read())
  kernels = []
  for plane in space.planes:
    names = {key: meta.name for key, meta in plane.event_metadata.items()}
    for line in plane.lines:
      # Every thread: the executor runs cheap kernels inline, on the
      # caller's thread too.
      for event in line.events:
        label = names.get(event.metadata_id, "")
        name, _, op_type = label.rpartition(":")
        # "name:Type" is a kernel; the executor's own events are "A::B".
        if name and op_type and "::" not in label:
          kernels.append(Kernel(name, op_type, event.duration_ps / 1e6))
  return kernels


def step_counts(kernels):
  """{steps, kernels_per_step, kernel_us_per_step, other_kernels (those
  outside any loop: tokenizer, encoder, search set-up), by_type (kernels a
  step, per op type)} of `executed_kernels`."""
  loops = collections.defaultdict(collections.Counter)
  body = [k for k in kernels if LOOP_BODY in "/" + k.name]
  for kernel in body:
    loops[("/" + kernel.name).split(LOOP_BODY)[0]][kernel.name] += 1
  steps = sum(max(names.values()) for names in loops.values())
  by_type = collections.Counter(k.type for k in body)
  per_step = lambda x: x / steps if steps else 0.0
  return {"steps": steps, "kernels_per_step": per_step(len(body)),
          "kernel_us_per_step": per_step(sum(k.microseconds for k in body)),
          "other_kernels": len(kernels) - len(body),
          "by_type": {name: per_step(count)
                      for name, count in by_type.most_common()}}
