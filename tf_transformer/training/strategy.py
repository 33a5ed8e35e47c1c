"""The tf.distribute strategy of a run: one device, all GPUs of a machine
(MirroredStrategy, 8 GPUs in the paper), several machines
(MultiWorkerMirroredStrategy from TF_CONFIG).

Without GPUs, `cpu_devices=N` splits the CPU into N logical devices so that
MirroredStrategy runs as it would on N GPUs. It must run before any op.
"""

import json
import os

import tensorflow as tf

from tf_transformer.choices import DISTRIBUTIONS


def split_cpu(cpu_devices: int):
  """Splits the CPU into `cpu_devices` logical devices (before any op)."""
  if cpu_devices and cpu_devices > 1:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * cpu_devices)


def create_strategy(distribution="one_device", num_gpus=None,
                    cpu_devices=0) -> tf.distribute.Strategy:
  if distribution not in DISTRIBUTIONS:
    raise ValueError(f"--distribution={distribution}: expected one of "
                     f"{DISTRIBUTIONS}")
  # First: listing logical devices starts the runtime, and collective ops
  # must be configured before that.
  if distribution == "multi_worker":
    if "TF_CONFIG" not in os.environ:
      raise ValueError("--distribution=multi_worker needs the TF_CONFIG "
                       "environment variable (cluster and task); see docs/training.md")
    try:
      json.loads(os.environ["TF_CONFIG"])
    except json.JSONDecodeError as e:
      raise ValueError(f"TF_CONFIG is not valid JSON: {e}") from None
    return tf.distribute.MultiWorkerMirroredStrategy()
  gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
  if num_gpus is not None:
    if num_gpus > len(gpus):
      raise ValueError(f"--num_gpus={num_gpus} but {len(gpus)} GPU(s) are "
                       "visible")
    gpus = gpus[:num_gpus]
  if distribution == "one_device":
    return tf.distribute.OneDeviceStrategy(gpus[0] if gpus else "/cpu:0")
  devices = gpus or [d.name for d in tf.config.list_logical_devices("CPU")]
  if len(devices) == 1 and not gpus and not cpu_devices:
    raise ValueError("--distribution=mirrored found no GPU and one CPU "
                     "device; pass --cpu_devices=N to split the CPU")
  return tf.distribute.MirroredStrategy(devices)


def is_chief(strategy: tf.distribute.Strategy) -> bool:
  """True on the worker that writes checkpoints and summaries."""
  resolver = getattr(strategy, "cluster_resolver", None)
  if resolver is None or not resolver.cluster_spec().as_dict():
    return True
  task_type, task_id = resolver.task_type, resolver.task_id
  return task_type in (None, "chief") or (
      task_type == "worker" and task_id == 0 and
      "chief" not in resolver.cluster_spec().as_dict())


def num_workers(strategy: tf.distribute.Strategy) -> int:
  """The processes a multi-worker run trains in (chief and workers); 1
  for any other strategy."""
  resolver = getattr(strategy, "cluster_resolver", None)
  spec = resolver.cluster_spec().as_dict() if resolver else {}
  return max(1, sum(len(spec.get(job, ())) for job in ("chief", "worker")))


def worker_id(strategy: tf.distribute.Strategy) -> int:
  resolver = getattr(strategy, "cluster_resolver", None)
  return int(getattr(resolver, "task_id", 0) or 0)
