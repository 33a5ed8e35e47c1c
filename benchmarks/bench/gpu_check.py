"""The model's training step on an accelerator under JAX, and its logits
against the TensorFlow CPU reference (`benchmarks/gpu_check.py`).

The paper's step (section 5): teacher-forced forward pass, label-smoothed
loss (5.4) with its closed-form gradient, Adam with eq. 3 (5.3), dropout
on, the whole step one `jax.jit` with its state donated. Batches are
synthetic: `batch_tokens` // `sequence_length` sentence pairs of
`sequence_length` random pieces a side (EOS last), the paper's ~25,000
tokens a side by default (5.1). Model FLOPs are `cost.forward_flops` times 3 (forward and
backward), so the utilization counts the matmuls the model asks for, not
what the compiler runs.

Nothing here imports TensorFlow: the accelerator machine has none.
`write_reference` runs on the TensorFlow backend (on CPU) and writes what
`check_logits` compares against on another backend.
"""

import gzip
import json
import math
import os
import time

import keras
import numpy as np

from bench import device_trace
from tf_transformer import config as config_lib
from tf_transformer import cost
from tf_transformer import model as model_lib
from tf_transformer.data.synthetic import random_pairs
from tf_transformer.layers import attention
from tf_transformer.layers import feed_forward
from tf_transformer.training import loss as loss_lib
from tf_transformer.training import optimizer as optimizer_lib

# Dense (no sparsity) peak matmul rates from NVIDIA's data sheets, in
# TFLOP/s: bfloat16, and TF32 (XLA's default for float32 dots on these
# chips). The H200 has the H100 SXM's compute.
PEAK_TFLOPS = {"H100": {"bfloat16": 989.4, "tf32": 494.7},
               "H200": {"bfloat16": 989.4, "tf32": 494.7}}
REFERENCE_FILES = ("config.json", "model.weights.h5", "batch.npz")
HLO_FILE = "step_hlo.txt.gz"  # the compiled step, beside its trace


def peak_tflops(device_kind, policy):
  """(the chip's dense peak for the policy's matmuls, its name) or
  (None, None) for a chip not in PEAK_TFLOPS."""
  precision = "bfloat16" if "bfloat16" in policy else "tf32"
  for chip, peaks in PEAK_TFLOPS.items():
    if chip in device_kind:
      return peaks[precision], f"{chip} dense {precision}"
  return None, None


def _train_step(model, optimizer, label_smoothing):
  """The jitted step: (state, batch) -> (loss, state), state donated."""
  import jax  # pylint: disable=g-import-not-at-top

  def loss_of(trainable, non_trainable, source, target_input, labels):
    logits, non_trainable = model.stateless_call(
        trainable, non_trainable, (source, target_input), training=True)
    return loss_lib.label_smoothed_cross_entropy(
        labels, logits, label_smoothing), non_trainable

  def step(state, source, target_input, labels):
    trainable, non_trainable, optimizer_state = state
    (loss, non_trainable), grads = jax.value_and_grad(loss_of, has_aux=True)(
        trainable, non_trainable, source, target_input, labels)
    trainable, optimizer_state = optimizer.stateless_apply(
        optimizer_state, grads, trainable)
    return loss, (trainable, non_trainable, optimizer_state)

  return jax.jit(step, donate_argnums=0)


def measure_training(preset, policy, batch_tokens=25000, sequence_length=50,
                     vocab_size=37000, max_steps=200, seconds=40.0,
                     hparams="", profile_dir=None, profile_steps=5,
                     ffn_padding=True, fused_attention=True):
  """Trains one preset under one dtype policy on synthetic batches.

  Args:
    preset: a `config.PRESETS` name ("base", "big", "tiny", ...).
    policy: a Keras dtype policy, "float32" or "mixed_bfloat16".
    batch_tokens, sequence_length: as `random_pairs`'s.
    vocab_size: the shared vocabulary (37,000 for WMT En-De, section 5.1).
    max_steps: the most timed steps.
    seconds: a time budget for the timed steps (at least 10 are run).
    hparams: config overrides.
    ffn_padding: False multiplies every feed-forward by W_1 and W_2
      unpadded (`feed_forward.inner_padding` patched to 0 in this process:
      the padding is for CPU caches).
    fused_attention: False computes eq. 1 as matmuls and a softmax
      (`scaled_dot_product_attention`, patched in for
      `attention.fused_attention` in this process) instead of
      `keras.ops.dot_product_attention`, which JAX may run as cuDNN's
      flash attention (the figures' "flash_attention" says whether its
      inputs qualify).
    profile_dir: if given, `profile_steps` more steps are traced there by
      `jax.profiler` after the timed ones, and summarized
      (`device_trace.summarize`, kernels named by the compiled HLO, also
      written there as `HLO_FILE`) as the figures' "profile".
    profile_steps: the steps traced.
  Returns:
    A dict of the figures (tokens/s counts source plus target tokens).
  """
  import jax  # pylint: disable=g-import-not-at-top
  config = config_lib.get_config(preset, hparams).replace(
      vocab_size=vocab_size)
  keras.utils.set_random_seed(0)
  if not ffn_padding:
    feed_forward.inner_padding = lambda d_ff, dtype: 0
  if not fused_attention:
    attention.fused_attention = _unfused_attention
  model = model_lib.build_model(config, dtype=policy)
  optimizer = optimizer_lib.create_optimizer(config)
  optimizer.build(model.trainable_variables)
  state = ([v.value for v in model.trainable_variables],
           [v.value for v in model.non_trainable_variables],
           [v.value for v in optimizer.variables])
  step = _train_step(model, optimizer, config.training.label_smoothing)
  device = jax.devices()[0]
  # Committed to the device, as the step's outputs are: one compilation.
  state = jax.device_put(state, device)
  batch = [jax.device_put(a, device) for a in random_pairs(
      vocab_size, batch_tokens, sequence_length)]
  # Two untimed steps: the first compiles; the second may compile again,
  # the state it is given now holding the step's own outputs.
  first_step_seconds, _, state = _timed_steps(step, state, batch, 1)
  second_step_seconds, _, state = _timed_steps(step, state, batch, 1)
  probe_seconds, _, state = _timed_steps(step, state, batch, 3)
  steps = int(min(max_steps, max(10, seconds / (probe_seconds / 3))))
  total_seconds, loss, state = _timed_steps(step, state, batch, steps)
  step_seconds = total_seconds / steps
  # The executable already compiled (JAX's cache): the names of a trace's
  # kernels.
  hlo_text = (step.lower(state, *batch).compile().as_text()
              if profile_dir else None)
  profile = None
  if profile_dir:  # after the timing; a failed trace fails only itself
    try:
      os.makedirs(profile_dir, exist_ok=True)
      with gzip.open(os.path.join(profile_dir, HLO_FILE), "wt") as f:
        f.write(hlo_text)
      state = device_trace.trace_steps(step, state, batch, profile_steps,
                                       profile_dir)
      path = device_trace.trace_file(profile_dir)
      profile = (device_trace.summarize(path, profile_steps,
                                        hlo_text=hlo_text) if path else
                 {"error": f"no Perfetto trace under {profile_dir}"})
    except Exception as e:  # pylint: disable=broad-except
      profile = {"error": f"{type(e).__name__}: {e}"[:300]}
  pairs, length = batch[0].shape
  flops = 3 * pairs * cost.forward_flops(config.model, length, length)
  peak, peak_name = peak_tflops(device.device_kind, policy)
  memory = device.memory_stats() or {}
  return {
      "preset": preset, "policy": policy, "hparams": hparams,
      "device": device.device_kind,
      "platform": device.platform, "parameters": cost.parameter_count(
          config.model), "sentence_pairs": pairs,
      "tokens_per_step": 2 * pairs * length, "steps": steps,
      "first_step_seconds": first_step_seconds,
      "second_step_seconds": second_step_seconds,
      "compilations": step._cache_size(),  # pylint: disable=protected-access
      "step_seconds": step_seconds,
      "tokens_per_second": 2 * pairs * length / step_seconds,
      "model_tflops_per_step": flops / 1e12,
      "model_tflops_per_second": flops / step_seconds / 1e12,
      "peak_tflops": peak, "peak_name": peak_name,
      "mfu": None if peak is None else flops / step_seconds / (peak * 1e12),
      "peak_memory_gib": (memory["peak_bytes_in_use"] / 2**30
                          if "peak_bytes_in_use" in memory else None),
      "memory_limit_gib": (memory["bytes_limit"] / 2**30
                           if "bytes_limit" in memory else None),
      "final_loss": float(loss),
      "ffn_padding": ffn_padding,
      "fused_attention": fused_attention,
      "flash_attention": _qualifies_for_flash(config, pairs, length, policy),
      "profile": profile,
  }


def _unfused_attention(query, key, value, mask=None):
  """`attention.fused_attention`'s result by `scaled_dot_product_attention`
  (heads on axis 1 there)."""
  swap = lambda x: keras.ops.transpose(x, (0, 2, 1, 3))
  output, _ = attention.scaled_dot_product_attention(
      swap(query), swap(key), swap(value), mask)
  return swap(output)


def _qualifies_for_flash(config, pairs, length, policy):
  """Whether Keras' JAX backend finds this model's attention inputs fit
  for cuDNN flash attention (its `_can_use_flash_attention`), or the
  reason it cannot tell; None off JAX."""
  if keras.backend.backend() != "jax":
    return None
  try:
    from keras.src.backend.jax import nn as jax_nn  # pylint: disable=g-import-not-at-top
    model = config.model
    dtype = keras.mixed_precision.Policy(policy).compute_dtype
    d_k = model.d_k or model.d_model // model.num_heads
    heads = keras.ops.zeros((pairs, length, model.num_heads, d_k), dtype)
    return bool(jax_nn._can_use_flash_attention(heads, heads, heads, None))  # pylint: disable=protected-access
  except Exception as e:  # pylint: disable=broad-except
    return f"{type(e).__name__}: {e}"[:200]


def _timed_steps(step, state, batch, steps):
  """(seconds for `steps` steps, the last loss, the state)."""
  start = time.perf_counter()
  for _ in range(steps):
    loss, state = step(state, *batch)
  loss.block_until_ready()
  return time.perf_counter() - start, loss, state


def write_reference(directory, model=None, preset="tiny", seed=0):
  """Writes a model's weights, a batch and its logits on this backend (the
  TensorFlow CPU reference when run there).

  Args:
    directory: created if missing; gets `REFERENCE_FILES`.
    model: a float32 `Transformer` (a trained one, say); None: `preset`
      with weights drawn from `seed`.
    preset: the model's preset when `model` is None.
    seed: the weights' and the batch's seed.
  Returns:
    The reference logits, float32 [batch, length, vocab].
  """
  os.makedirs(directory, exist_ok=True)
  if model is None:
    keras.utils.set_random_seed(seed)
    model = model_lib.build_model(config_lib.get_config(preset),
                                  dtype="float32")
  config = model.config
  source, target_input, _ = random_pairs(config.model.vocab_size, 96, 12,
                                         seed)
  source[1, 9:] = target_input[2, 7:] = 0  # padding, masked
  logits = keras.ops.convert_to_numpy(model((source, target_input)))
  model.save_weights(os.path.join(directory, "model.weights.h5"))
  np.savez(os.path.join(directory, "batch.npz"), source=source,
           target_input=target_input, logits=logits)
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(config.to_dict(), f)
  return logits


def check_logits(directory):
  """The reference model's logits on this backend's default device against
  those `write_reference` wrote, matmuls in full float32.

  Args:
    directory: what `write_reference` wrote.
  Returns:
    {"max_abs_diff", "max_abs_logit", "device"}.
  """
  with open(os.path.join(directory, "config.json")) as f:
    config = config_lib.TransformerConfig.from_dict(json.load(f))
  model = model_lib.build_model(config, dtype="float32")
  model.load_weights(os.path.join(directory, "model.weights.h5"))
  batch = np.load(os.path.join(directory, "batch.npz"))
  with _full_float32_matmuls():
    logits = keras.ops.convert_to_numpy(
        model((batch["source"], batch["target_input"])))
  return {"max_abs_diff": float(np.max(np.abs(logits - batch["logits"]))),
          "max_abs_logit": float(np.max(np.abs(batch["logits"]))),
          "device": _device_name()}


def _full_float32_matmuls():
  """JAX's float32 dots in float32 (its default on GPUs is TF32)."""
  import contextlib  # pylint: disable=g-import-not-at-top
  if keras.backend.backend() != "jax":
    return contextlib.nullcontext()
  import jax  # pylint: disable=g-import-not-at-top
  return jax.default_matmul_precision("float32")


def _device_name():
  """The default device's kind under JAX ("cpu", "NVIDIA H200") and
  PyTorch; the backend's name elsewhere."""
  backend = keras.backend.backend()
  if backend == "jax":
    import jax  # pylint: disable=g-import-not-at-top
    return jax.devices()[0].device_kind
  if backend == "torch":
    import torch  # pylint: disable=g-import-not-at-top
    return (torch.cuda.get_device_name() if torch.cuda.is_available()
            else "cpu")
  return backend


def markdown(rows, logits):
  """The figures as a markdown table, the logits check below it."""
  fmt = lambda value, spec: "-" if value is None else format(value, spec)
  lines = ["| preset | policy | lever | device | params (M) | tokens/step | "
           "step (ms) | tokens/s | model TFLOP/s | MFU | peak used | "
           "peak memory (GiB) | steps | loss |",
           "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | "
           "--- | ---: | ---: | ---: |"]
  for r in rows:
    if "error" in r:
      lines.append(f"| {r['preset']} | {r['policy']} | "
                   f"{r.get('lever') or '-'} | failed: {r['error']} |"
                   + " |" * 10)
      continue
    peak = (f"{r['peak_name']} {r['peak_tflops']:.1f}" if r["peak_tflops"]
            else "-")
    lever = r.get("lever") or "-"
    lines.append(
        f"| {r['preset']} | {r['policy']} | {lever} | "
        f"{r['device']} | "
        f"{r['parameters'] / 1e6:.0f} | {r['tokens_per_step']:,} | "
        f"{1000 * r['step_seconds']:.1f} | {r['tokens_per_second']:,.0f} | "
        f"{r['model_tflops_per_second']:.1f} | "
        f"{fmt(r['mfu'] and 100 * r['mfu'], '.1f')}"
        f"{'%' if r['mfu'] is not None else ''} | "
        f"{peak} | "
        f"{fmt(r['peak_memory_gib'], '.1f')} | {r['steps']} | "
        f"{r['final_loss']:.3f} |")
  for r in rows:
    if r.get("profile"):
      label = " ".join(filter(None, (r["preset"], r["policy"], r.get("lever"))))
      lines += [""] + (device_trace.markdown(label, r["profile"])
                       if "threads" in r["profile"] else
                       [f"Trace of {label}: {r['profile']['error']}"])
  if logits is not None:
    lines.append("")
    if "error" in logits:
      lines.append(f"Logits against the TensorFlow CPU reference: failed: "
                   f"{logits['error']}")
    else:
      lines.append(
          f"Logits against the TensorFlow CPU reference on {logits['device']}"
          f" (float32 matmuls): max |difference| "
          f"{logits['max_abs_diff']:.2e} for logits up to "
          f"{logits['max_abs_logit']:.1f}.")
  return "\n".join(lines) + "\n"


def is_finite(row):
  """Whether a row's loss is a finite number (a step that ran)."""
  return "error" not in row and math.isfinite(row["final_loss"])
