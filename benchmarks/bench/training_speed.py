"""Training speed: seconds per optimizer update and source+target tokens/s
of the real training step (`training.trainer.Trainer`: loss, gradients,
Adam, distribution) on a fixed synthetic batch, and the model FLOPs
utilisation that follows from `cost.forward_flops` (times 3 for forward and
backward, as in `bin/model_summary.py`)."""

import dataclasses

import tensorflow as tf

from tf_transformer import cost
from tf_transformer.training import step_timing


@dataclasses.dataclass(frozen=True)
class Variant:
  """One way to run the step."""
  name: str
  xla_loss: bool = True
  xla_attention: bool = False
  mixed_precision: str = None
  devices: int = 1  # > 1: MirroredStrategy over that many CPU devices


def _strategy(devices):
  if devices == 1:
    return tf.distribute.OneDeviceStrategy("/cpu:0")
  return tf.distribute.MirroredStrategy(
      [f"/cpu:{i}" for i in range(devices)],
      cross_device_ops=tf.distribute.ReductionToOneDevice())


def measure(config, variant: Variant, batch_tokens, length, runs=3, warmup=2,
            peak_gflops=None):
  """A dict of figures for one variant and one sentence length."""
  try:
    seconds, rows = step_timing.seconds_per_step(
        config, batch_tokens, length, runs, warmup,
        _strategy(variant.devices),
        xla_loss=variant.xla_loss, xla_attention=variant.xla_attention,
        mixed_precision=variant.mixed_precision)
  except RuntimeError as error:  # which of the variants
    raise RuntimeError(f"{variant.name}: {error}") from error
  tokens = 2 * rows * length
  model_flops = 3 * cost.forward_flops(config.model, length, length) * rows
  figures = {"variant": variant.name, "length": length, "rows": rows,
             "seconds_per_step": seconds, "tokens_per_sec": tokens / seconds,
             "model_gflops_per_sec": model_flops / seconds / 1e9}
  if peak_gflops:
    figures["mfu"] = figures["model_gflops_per_sec"] / peak_gflops
  return figures
