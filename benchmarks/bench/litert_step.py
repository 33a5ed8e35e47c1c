"""The decoding step alone, TensorFlow against LiteRT, on a trained run's
weights and real sources (the serving section's `--litert_step` rows).

Each side runs the same loop of --litert_steps decoder steps (`Step`,
section 3.1's decoder stack over a cache) from BOS, feeding each row's
argmax back, on the memory of real source lines:

- TensorFlow, as the SavedModel runs its search: the step with weights read
  once as tensors and the cache that grows by blocks and is written in
  place, in a `tf.while_loop` inside one `tf.function`, in float32 and in
  bfloat16 (the export's `--dtype`s);
- LiteRT: the same loop with the static cache (every block from the start,
  written by a scatter: the form a converter takes), converted by
  `tf.lite.TFLiteConverter` and run by `ai-edge-litert`'s interpreter
  (XNNPACK), with float32 weights and with int8 weights
  (`Optimize.DEFAULT`: dynamic range, XNNPACK's dynamically quantized
  kernels).

Run by path in a process of its own (`python litert_step.py REQUEST.json`),
one intra-op and one inter-op thread and one interpreter thread; the
engines take turns, run after run. Prints JSON: per rows, per engine the
CPU seconds of each timed loop, and the ids each engine chose.
"""

import json
import sys
import tempfile
import time


def _sources(vocabulary, lines, sentences):
  """[sentences, S] int32 source ids of the first lines (EOS appended),
  PAD-padded; lines repeat where there are fewer."""
  # pylint: disable=g-import-not-at-top
  import numpy as np
  from tf_transformer.special_ids import EOS_ID, PAD_ID
  ids = [list(vocabulary.tokenize(lines[i % len(lines)]).numpy()) + [EOS_ID]
         for i in range(sentences)]
  out = np.full((sentences, max(map(len, ids))), PAD_ID, np.int32)
  for row, line in enumerate(ids):
    out[row, :len(line)] = line
  return out


def _loop(model, static, steps, group):
  """tf.function(memory, source_mask) -> ids [rows, steps]: `steps`
  decoder steps from BOS, each row's argmax fed back."""
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  from tf_transformer.decoding import cache as cache_lib
  from tf_transformer.decoding.step import Step, read
  from tf_transformer.special_ids import BOS_ID
  step = Step(model, static=static)
  weights = read(step, None, steps)

  def loop(memory, source_mask):
    cache = step.initial_cache(weights, memory, steps, group)
    rows = tf.shape(memory)[0] * group
    ids = tf.fill([rows, 1], BOS_ID)
    chosen = tf.zeros([rows, steps], tf.int32)

    def body(t, ids, cache, chosen):
      logits, cache = step(ids, t, cache, source_mask, weights)
      ids = tf.argmax(logits, -1, output_type=tf.int32)[:, tf.newaxis]
      # (a one-hot add: a fixed shape, no scatter)
      return t + 1, ids, cache, chosen + ids * tf.one_hot(
          t, steps, dtype=tf.int32)
    invariants = (tf.TensorShape([]), tf.TensorShape([None, 1]),
                  cache_lib.loop_shapes(cache), tf.TensorShape([None, steps]))
    _, _, _, chosen = tf.while_loop(
        lambda t, *_: t < steps, body, (tf.constant(0), ids, cache, chosen),
        shape_invariants=None if static else invariants,
        maximum_iterations=steps)
    return chosen
  return loop


def _tflite(model, memory, mask, steps, group, quantize):
  """The static loop for these shapes, converted: the interpreter's
  `run(memory, mask) -> ids`, and the file's size in bytes."""
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  from ai_edge_litert.interpreter import Interpreter
  loop = tf.function(_loop(model, True, steps, group), autograph=False,
                     input_signature=[
      tf.TensorSpec(memory.shape, tf.float32),
      tf.TensorSpec(mask.shape, tf.bool)])
  converter = tf.lite.TFLiteConverter.from_concrete_functions(
      [loop.get_concrete_function()], model)
  if quantize:
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
  flat = converter.convert()
  interpreter = Interpreter(model_content=flat, num_threads=1)
  run = interpreter.get_signature_runner()
  names = sorted(interpreter.get_signature_list()["serving_default"][
      "inputs"])

  def call(memory, mask):
    out = run(**dict(zip(names, (memory, mask))))
    return next(iter(out.values()))
  return call, len(flat)


def _cpu_seconds(fn, runs, warmup):
  for _ in range(warmup):
    fn()
  times = []
  for _ in range(runs):
    start = time.process_time()
    fn()
    times.append(time.process_time() - start)
  return times


def main(path):
  with open(path, encoding="utf-8") as f:
    request = json.load(f)
  # pylint: disable=g-import-not-at-top  (threads before TensorFlow starts)
  import tensorflow as tf
  tf.config.threading.set_intra_op_parallelism_threads(1)
  tf.config.threading.set_inter_op_parallelism_threads(1)
  import numpy as np
  from tf_transformer.model import with_dtype_policy
  from tf_transformer.run import run_dir
  model, vocabulary = run_dir.load_trained_model(request["model_dir"])
  models = {"float32": model, "bfloat16": with_dtype_policy(model,
                                                            "bfloat16")}
  steps, group = request["steps"], request["group"]
  result = {"rows": {}}
  for rows in request["rows"]:
    source = _sources(vocabulary, request["sentences"], rows // group)
    memory, mask = model.encode(tf.constant(source))
    engines = {}
    for dtype, m in models.items():
      fn = tf.function(_loop(m, False, steps, group), autograph=False)
      # Each model's own memory dtype, as its export encodes.
      mem = tf.cast(memory, m.compute_dtype)
      engines[f"tensorflow_{dtype}"] = (
          lambda fn=fn, mem=mem: fn(mem, mask).numpy())
    sizes = {}
    for quantize in (False, True):
      name = "litert_" + ("int8" if quantize else "float32")
      call, sizes[name] = _tflite(model, memory, mask, steps, group,
                                  quantize)
      engines[name] = (lambda call=call: np.asarray(
          call(memory.numpy(), mask.numpy())))
    ids = {name: fn().tolist() for name, fn in engines.items()}
    seconds = {name: [] for name in engines}
    for _ in range(request["runs"]):  # the engines take turns
      for name, fn in engines.items():
        seconds[name] += _cpu_seconds(fn, 1, 0)
    result["rows"][str(rows)] = {"cpu_seconds": seconds, "ids": ids,
                                 "tflite_bytes": sizes}
  json.dump(result, sys.stdout)


if __name__ == "__main__":
  main(sys.argv[1])
