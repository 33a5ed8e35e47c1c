"""Mixed precision chosen for the host a run trains on. Where TensorFlow
sees GPUs: bfloat16 on compute capability 8.0 and later (Ampere on, whose
tensor cores take it), float16 with dynamic loss scaling before (Volta,
Turing). On CPUs: bfloat16 only where the CPU multiplies it natively
(AVX512_BF16 or AMX) and a short probe of the run's own training step finds
it faster than float32; otherwise float32. The choice is saved in the run directory, so a resumed run keeps
it (docs/training.md, "Mixed precision for the host")."""

import dataclasses
import json
import os
from typing import Callable, Optional

import tensorflow as tf

from tf_transformer import cpu
from tf_transformer.training import step_timing

AUTO = "auto"  # --mixed_precision=auto: choose by this module
FLOAT32 = "float32"  # --mixed_precision=float32: none
FILENAME = "precision.json"
# bfloat16 must be this much faster in the probe: two short timings on a
# shared host move by a few percent, and a wrong bfloat16 costs precision
# as well as time.
MARGIN = 1.1
PROBE_LENGTH = 32  # tokens a sentence of the probe's batch, each side
PROBE_STEPS = 3  # timed updates, after one untimed (tracing included)


@dataclasses.dataclass(frozen=True)
class Choice:
  mixed_precision: Optional[str]  # "bfloat16", or None for float32
  reason: str  # one line for the log
  # The probe's tokens/s in the chosen precision; None: not probed.
  tokens_per_sec: Optional[float] = None


def probe_tokens_per_sec(config, mixed_precision, length=PROBE_LENGTH,
                         steps=PROBE_STEPS, strategy=None):
  """Source and target tokens a second of `config`'s training step (loss,
  gradients, Adam; section 5) on the device a run trains on by default
  (the first GPU, else the CPU), or under `strategy`.

  Args:
    config: a TransformerConfig; its batch_tokens set the batch.
    mixed_precision: None (float32) or "bfloat16".
    length: tokens a sentence, each side, of the random batch.
    steps: updates timed, after one untimed update.
    strategy: a tf.distribute strategy; None: `step_timing`'s default.
  Returns:
    tokens a second, from the median update's time.
  """
  seconds, rows = step_timing.seconds_per_step(
      config, config.training.batch_tokens, length, runs=steps,
      strategy=strategy, mixed_precision=mixed_precision)
  return 2 * rows * length / seconds


def gpu_capabilities():
  """[(name, (major, minor))]: each GPU TensorFlow sees, with its CUDA
  compute capability."""
  found = []
  for gpu in tf.config.list_physical_devices("GPU"):
    details = tf.config.experimental.get_device_details(gpu)
    found.append((details.get("device_name", gpu.name),
                  tuple(details.get("compute_capability", (0, 0)))))
  return found


def choose(config, cpuinfo=cpu.CPUINFO,
           probe: Callable[..., float] = probe_tokens_per_sec,
           gpus: Callable[[], list] = gpu_capabilities) -> Choice:
  """float32, bfloat16 or float16 for training `config` on this host.

  Args:
    config: the run's TransformerConfig.
    cpuinfo: where the CPU's flags are read.
    probe: tokens a second of `config` under a mixed precision (None:
      float32), `probe_tokens_per_sec` unless a test forces a result.
    gpus: the GPUs and their compute capabilities, `gpu_capabilities`
      unless a test fakes the device query.
  Returns:
    A Choice: with GPUs, bfloat16 where the oldest has compute capability
    8.0 or later, else float16 (dynamic loss scaling); without, bfloat16
    where the CPU has AVX512_BF16 or AMX and the probe finds it at least
    MARGIN times faster, else float32. Its reason names the GPUs and their
    capability, or the CPU's instructions and the probe's figures.
  """
  devices = gpus()
  if devices:
    oldest = min(capability for _, capability in devices)
    names = ", ".join(sorted({name for name, _ in devices}))
    seen = (f"{len(devices)} GPU(s) ({names}), compute capability "
            f"{oldest[0]}.{oldest[1]}")
    if oldest >= (8, 0):
      return Choice("bfloat16", f"bfloat16: {seen}, whose tensor cores "
                    "multiply bfloat16 (8.0 and later)")
    return Choice("float16", f"float16 with dynamic loss scaling: {seen}, "
                  "before bfloat16's 8.0")
  found = cpu.bfloat16_flags(cpuinfo)
  if not found:
    return Choice(None, "float32: this CPU has neither AVX512_BF16 nor AMX "
                  "(bfloat16 would be emulated, slower)" if found == [] else
                  f"float32: could not read {cpuinfo} to check the CPU for "
                  "bfloat16 instructions")
  float32, bfloat16 = probe(config, None), probe(config, "bfloat16")
  ratio = bfloat16 / float32
  measured = (f"this CPU has {' and '.join(found)}; a probe of the training "
              f"step gave {bfloat16:,.0f} tokens/s in bfloat16 against "
              f"{float32:,.0f} in float32, {ratio:.2f}x")
  if ratio >= MARGIN:
    return Choice("bfloat16", f"bfloat16: {measured}", bfloat16)
  return Choice(None, f"float32: {measured}, below the {MARGIN}x that "
                "bfloat16 must gain", float32)


def resolve(model_dir, mixed_precision, config, workers=1, **choose_args):
  """The mixed precision a run trains in, and the line saying why.

  Args:
    model_dir: the run directory; its FILENAME keeps an automatic choice.
    mixed_precision: the flag: AUTO, FLOAT32, "", None, "bfloat16" or
      "float16". Only AUTO chooses; the others are taken as given.
    config: the run's TransformerConfig.
    workers: the run's worker processes; AUTO probes one host, so it is
      refused for more than one.
    **choose_args: passed to `choose` (a test's forced probe).
  Returns:
    (None, "bfloat16" or "float16"; a line for the log, or None where the
    flag was given).
  Raises:
    ValueError: AUTO for a run of several workers.
  """
  if mixed_precision != AUTO:
    return (None if mixed_precision in (None, "", FLOAT32)
            else mixed_precision), None
  if workers > 1:
    raise ValueError("--mixed_precision=auto probes one host; a run of "
                     f"{workers} workers needs float32 or bfloat16 given")
  path = os.path.join(model_dir, FILENAME)
  if tf.io.gfile.exists(path):
    with tf.io.gfile.GFile(path) as f:
      kept = json.load(f)
    return kept["mixed_precision"], (
        f"{kept['reason']} (chosen at the run's first start, kept)")
  choice = choose(config, **choose_args)
  with tf.io.gfile.GFile(path, "w") as f:  # one worker: the chief
    json.dump(dataclasses.asdict(choice), f)
  return choice.mixed_precision, choice.reason


def kept_tokens_per_sec(model_dir):
  """The probe's tokens/s that `resolve` kept in `model_dir` for the
  precision it chose, or None (not chosen there, or chosen without a
  probe)."""
  path = os.path.join(model_dir, FILENAME)
  if not tf.io.gfile.exists(path):
    return None
  with tf.io.gfile.GFile(path) as f:
    return json.load(f).get("tokens_per_sec")
