"""This machine's fp32 matmul peak and memory bandwidth, and what the
machine and the software are, for benchmark reports."""

import importlib
import os
import sys

import numpy as np
import tensorflow as tf

from tf_transformer import cpu
from tf_transformer.stopwatch import median_seconds


def matmul_peak(n=4096, runs=5):
  """GFLOP/s of an n x n x n fp32 matmul in TensorFlow and in numpy: the
  peak the model FLOPs utilisation is measured against."""
  a = tf.random.stateless_normal([n, n], seed=[1, 2])
  b = tf.random.stateless_normal([n, n], seed=[3, 4])
  matmul = tf.function(lambda x, y: tf.reduce_sum(tf.matmul(x, y)[:1, :1]),
                       autograph=False)
  flops = 2.0 * n ** 3
  tf_seconds = median_seconds(lambda: matmul(a, b).numpy(), runs)
  a_np, b_np = a.numpy(), b.numpy()
  np_seconds = median_seconds(lambda: a_np @ b_np, runs)
  return {"n": n, "tensorflow_gflops": flops / tf_seconds / 1e9,
          "numpy_gflops": flops / np_seconds / 1e9}


def read_bandwidth(megabytes=256, depth=64, group=4, block_rows=64, runs=5,
                   dtype=tf.float32, sentence_heads=256):
  """GB/s at which TensorFlow reads a `dtype` tensor of `megabytes` (more
  than the CPU's caches hold) with
  - a full reduction: about the memory's speed;
  - the batched matmuls of cached attention, `group` queries per block of
    `block_rows` keys or values of `depth`, each of `sentence_heads`
    (batch x heads) queries meeting its own blocks, as in
    decoding/cache.py attends:
    scores Q K^T (K read with `transpose_b`), the same scores transposed
    as K Q^T (K the left operand, read as stored), Q times K stored
    transposed, and weights times V."""
  dtype = tf.as_dtype(dtype)
  # At least 2: with oneDNN, TensorFlow 2.21's batched matmul of a left
  # operand with a size-1 batch axis against a broadcast right one crashes
  # or corrupts memory (tensorflow/tensorflow#123109; K Q^T below).
  sentence_heads = max(2, sentence_heads)
  blocks = max(1, int(megabytes * 1e6) // (
      dtype.size * sentence_heads * block_rows * depth))
  normal = lambda shape, seed: tf.cast(
      tf.random.stateless_normal(shape, seed=seed), dtype)
  cache = normal([blocks, sentence_heads, block_rows, depth], [5, 6])
  cache_t = normal([blocks, sentence_heads, depth, block_rows], [5, 7])
  q = normal([1, sentence_heads, group, depth], [7, 8])
  p = normal([1, sentence_heads, group, block_rows], [7, 9])
  corner = lambda x: tf.reduce_sum(x[:, :, :1, :1])
  graph = lambda fn: tf.function(fn, autograph=False)
  reads = {
      "reduction": (graph(tf.reduce_sum), (cache,)),
      "scores_matmul": (graph(lambda q, k: corner(
          tf.matmul(q, k, transpose_b=True))), (q, cache)),
      "scores_matmul_keys_left": (graph(lambda q, k: corner(
          tf.matmul(k, q, transpose_b=True))), (q, cache)),
      "scores_matmul_transposed_keys": (graph(lambda q, k: corner(
          tf.matmul(q, k))), (q, cache_t)),
      "values_matmul": (graph(lambda p, v: corner(tf.matmul(p, v))),
                        (p, cache)),
  }
  gigabytes = blocks * sentence_heads * block_rows * depth * dtype.size / 1e9
  speeds = {"dtype": dtype.name, "megabytes": gigabytes * 1e3}
  for name, (fn, args) in reads.items():
    speeds[f"{name}_gb_per_sec"] = gigabytes / median_seconds(
        lambda fn=fn, args=args: fn(*args).numpy(), runs)
  return speeds


def machine():
  """The machine and the software a report was measured with."""
  import keras  # pylint: disable=g-import-not-at-top
  versions = {"python": sys.version.split()[0], "tensorflow": tf.__version__,
              "keras": keras.__version__, "numpy": np.__version__}
  for name in ("tensorflow_text", "ctranslate2"):
    try:
      versions[name] = importlib.import_module(name).__version__
    except ImportError:
      pass
  return {
      "cpu": cpu.model_name(), "cpu_flags": sorted((cpu.flags() or set()) & {
          "avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}),
      "cores": os.cpu_count(),
      "gpus": len(tf.config.list_physical_devices("GPU")),
      "TF_ENABLE_ONEDNN_OPTS": os.environ.get("TF_ENABLE_ONEDNN_OPTS", ""),
      "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
      "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
      "versions": versions,
  }
