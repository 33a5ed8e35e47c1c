"""Training speed: seconds per optimizer update and source+target tokens/s
of the real training step (`training.trainer.Trainer`: loss, gradients,
Adam, distribution) on a fixed synthetic batch, and the model FLOPs
utilisation that follows from `cost.forward_flops` (times 3 for forward and
backward, as in `bin/model_summary.py`)."""

import dataclasses
import tempfile

import numpy as np
import tensorflow as tf

from tf_transformer import cost
from tf_transformer.benchmark import gpu_check
from tf_transformer.stopwatch import median_seconds
from tf_transformer.data.sources import DataSpec
from tf_transformer.training import optimizer as optimizer_lib
from tf_transformer.training import trainer as trainer_lib


@dataclasses.dataclass(frozen=True)
class Variant:
  """One way to run the step."""
  name: str
  xla_attention: bool = True
  xla_loss: bool = True
  jit_compile_step: bool = False
  mixed_precision: str = None
  devices: int = 1  # > 1: MirroredStrategy over that many CPU devices


def synthetic_batch(vocab_size, batch_tokens, length, seed=0):
  """((source, target_in), target_out) as tensors: `gpu_check`'s batch of
  batch_tokens // length full rows of `length` random tokens a side."""
  source, target_in, target = gpu_check.synthetic_batch(
      vocab_size, batch_tokens, length, seed)
  return (tf.constant(source), tf.constant(target_in)), tf.constant(target)


def _strategy(devices):
  if devices == 1:
    return tf.distribute.OneDeviceStrategy("/cpu:0")
  return tf.distribute.MirroredStrategy(
      [f"/cpu:{i}" for i in range(devices)],
      cross_device_ops=tf.distribute.ReductionToOneDevice())


def measure(config, variant: Variant, batch_tokens, length, runs=3, warmup=2,
            peak_gflops=None):
  """A dict of figures for one variant and one sentence length."""
  config = config.replace(train_steps=10**9, batch_tokens=batch_tokens)
  options = trainer_lib.TrainOptions(
      model_dir=tempfile.mkdtemp(prefix="tf_transformer_bench_"),
      max_length=length,
      eval_every_steps=0, checkpoint_every_secs=0,
      jit_compile_step=variant.jit_compile_step,
      xla_attention=variant.xla_attention, xla_loss=variant.xla_loss,
      mixed_precision=variant.mixed_precision, log_gradient_norm=False)
  trainer = trainer_lib.Trainer(config, None, DataSpec(), options,
                                _strategy(variant.devices))
  batch = synthetic_batch(config.model.vocab_size, batch_tokens, length)
  train_step = trainer.fixed_batch_step(batch)

  def step():
    if not np.isfinite(train_step()):
      raise RuntimeError(f"{variant.name}: the loss is not finite")

  seconds = median_seconds(step, runs, warmup)
  rows = int(batch[1].shape[0])
  tokens = 2 * rows * length
  model_flops = 3 * cost.forward_flops(config.model, length, length) * rows
  figures = {"variant": variant.name, "length": length, "rows": rows,
             "seconds_per_step": seconds, "tokens_per_sec": tokens / seconds,
             "model_gflops_per_sec": model_flops / seconds / 1e9}
  if peak_gflops:
    figures["mfu"] = figures["model_gflops_per_sec"] / peak_gflops
  optimizer_lib.set_mixed_precision(None)
  return figures
