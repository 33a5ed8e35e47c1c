#!/usr/bin/env python3
r"""The paper's training step on a GPU under JAX: tokens/s, step time, peak
memory and MFU for `base` and `big`, float32 and mixed_bfloat16, on
synthetic batches of the paper's ~25,000 tokens a side; and the GPU's
logits for one fixed weights file against the TensorFlow CPU reference.
Writes gpu_check.json and gpu_check.md to --output_dir.

  # here, on the TensorFlow backend: the reference that travels
  benchmarks/gpu_check.py --write_reference=.gpu_reference
  # on the accelerator (no TensorFlow there):
  KERAS_BACKEND=jax benchmarks/gpu_check.py --reference=.gpu_reference \
      --output_dir=$OUT

Each preset and policy trains in a process of its own, so that its peak
memory is its own and a failure (out of memory, say) is one row. Runs on a
CPU too (`--presets=tiny`, which the test suite does). Unlike the other
bin/ commands it never imports TensorFlow (`command.run(main,
tensorflow=False)`): the accelerator machine has none.
"""

import json
import os
import subprocess
import sys

from absl import app
from absl import flags

from tf_transformer import command

FLAGS = flags.FLAGS
flags.DEFINE_list("presets", ["base", "big"], "Model presets trained.")
flags.DEFINE_list("policies", ["mixed_bfloat16", "float32"], "Keras dtype "
                  "policies each preset trains under.")
flags.DEFINE_string("hparams", "", "Config overrides for every preset.")
flags.DEFINE_integer("vocab_size", 37000, "Shared vocabulary size (section "
                     "5.1's 37,000 for English-German).")
flags.DEFINE_integer("batch_tokens", 25000, "Tokens a side of a batch "
                     "(section 5.1).")
flags.DEFINE_integer("sequence_length", 50, "Tokens a sentence, each side.")
flags.DEFINE_integer("max_steps", 200, "Most timed steps a preset and policy.")
flags.DEFINE_float("seconds", 40.0, "Time budget of the timed steps of a "
                   "preset and policy (at least 10 steps run).")
flags.DEFINE_string("reference", None, "What --write_reference wrote: check "
                    "this backend's logits against it.")
flags.DEFINE_string("write_reference", None, "Write the reference (a fixed "
                    "tiny model's weights, a batch, its logits) to this "
                    "directory and stop; run it on the TensorFlow backend.")
flags.DEFINE_string("output_dir", ".", "Where gpu_check.json and "
                    "gpu_check.md go.")
flags.DEFINE_list("levers", [], "Extra rows of the first preset under "
                  "mixed_bfloat16, each one lever changed: no_dropout "
                  "(dropout_rate=0: what dropout's random bits cost), "
                  "batch_2x (twice --batch_tokens), no_ffn_padding "
                  "(the feed-forward's inner layer unpadded: its padding "
                  "is for CPU caches), unfused_attention (eq. 1 as "
                  "matmuls and a softmax, not keras.ops."
                  "dot_product_attention).")
flags.DEFINE_bool("fused_attention", True, "Eq. 1 by "
                  "keras.ops.dot_product_attention (cuDNN flash attention "
                  "where JAX finds the inputs fit); false: as matmuls and "
                  "a softmax.")
flags.DEFINE_bool("ffn_padding", True, "Feed-forward inner layers padded "
                  "off cache-aliasing widths (`feed_forward.inner_padding`).")
flags.DEFINE_string("profile_dir", None, "If given, trace --profile_steps "
                    "steps of each row with jax.profiler into a folder of "
                    "it per row, beside the compiled step's HLO "
                    "(step_hlo.txt.gz), and add where the device time went "
                    "to the figures, each kernel with its HLO shape and "
                    "the layer it came from.")
flags.DEFINE_integer("profile_steps", 5, "Steps traced a row.")
flags.DEFINE_list("rows", [], "PRESET:POLICY[:LEVER] rows to run instead "
                  "of --presets, --policies and --levers; levers combine "
                  "with '+' (base:mixed_bfloat16:no_dropout+batch_2x).")
flags.DEFINE_string("one", None, "Internal: train PRESET:POLICY and print "
                    "its figures as JSON.")
flags.DEFINE_integer("timeout", 300, "Seconds a preset and policy may take.")


def _one(preset, policy):
  from bench import gpu_check  # pylint: disable=g-import-not-at-top
  figures = gpu_check.measure_training(
      preset, policy, FLAGS.batch_tokens, FLAGS.sequence_length,
      FLAGS.vocab_size, FLAGS.max_steps, FLAGS.seconds, FLAGS.hparams,
      FLAGS.profile_dir, FLAGS.profile_steps, FLAGS.ffn_padding,
      FLAGS.fused_attention)
  print("FIGURES " + json.dumps(figures))


# Flag values and environment variables set, by lever: --hparams are
# added to the run's, other flags replaced. (JAX's rbg random bits are no
# lever: Keras' seed generator makes threefry keys.)
LEVERS = {"no_dropout": ({"hparams": "dropout_rate=0.0"}, {}),
          "batch_2x": ({"batch_tokens": lambda tokens: 2 * tokens}, {}),
          "no_ffn_padding": ({"ffn_padding": lambda _: False}, {}),
          "unfused_attention": ({"fused_attention": lambda _: False}, {})}
ROW_FLAGS = ("hparams", "vocab_size", "batch_tokens", "sequence_length",
             "max_steps", "seconds", "ffn_padding", "fused_attention",
             "profile_steps")


def _row_flag(name, lever_values):
  """A child's flag value: the run's, with a lever's hparams added or its
  function of the run's value taken."""
  value, lever = getattr(FLAGS, name), lever_values.get(name)
  if name == "hparams":
    return ",".join(v for v in (value, lever) if v)
  return value if lever is None else lever(value)


def _lever_settings(lever):
  """(flag values, environment) of a lever, or of levers joined by '+':
  their hparams joined, other flags and variables merged. An unknown
  lever is a UsageError."""
  flag_values, env = {}, {}
  for name in lever.split("+") if lever else ():
    if name not in LEVERS:
      raise app.UsageError(f"lever {name!r}: expected one of "
                           f"{sorted(LEVERS)}, or several joined by '+'")
    values, variables = LEVERS[name]
    for flag, value in values.items():
      if flag == "hparams" and flag in flag_values:
        value = f"{flag_values[flag]},{value}"
      flag_values[flag] = value
    env.update(variables)
  return flag_values, env


def _in_own_process(preset, policy, lever=None):
  """One preset and policy (and lever) in a child process: its figures, or
  an error."""
  flag_values, env = _lever_settings(lever)
  args = [sys.executable, os.path.abspath(__file__), f"--one={preset}:{policy}"]
  for name in ROW_FLAGS:
    args.append(f"--{name}={_row_flag(name, flag_values)}")
  if FLAGS.profile_dir:
    label = "_".join(filter(None, (preset, policy, lever))).replace("+", "-")
    args.append(f"--profile_dir={os.path.join(FLAGS.profile_dir, label)}")
  # JAX takes 75% of the GPU's memory by default; a process of its own
  # may take nearly all of it.
  env = {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.95", **os.environ, **env}
  named = {"preset": preset, "policy": policy, "lever": lever}
  try:
    done = subprocess.run(args, capture_output=True, text=True, env=env,
                          timeout=FLAGS.timeout, check=False)
  except subprocess.TimeoutExpired:
    return {**named, "error": f"over --timeout={FLAGS.timeout} s"}
  for line in done.stdout.splitlines():
    if line.startswith("FIGURES "):
      return {**json.loads(line[len("FIGURES "):]), **named}
  # The exception's own line: JAX ends a traceback with a note after it.
  lines = [line for line in done.stderr.strip().splitlines()
           if line.strip() and not line.startswith(("For simplicity", "---"))]
  last = (lines or ["no output"])[-1]
  return {**named, "error": f"exit {done.returncode}: {last[:300]}"}


def main(argv):
  del argv
  if FLAGS.one:
    _one(*FLAGS.one.split(":"))
    return
  from bench import gpu_check  # pylint: disable=g-import-not-at-top
  if FLAGS.write_reference:
    gpu_check.write_reference(FLAGS.write_reference)
    print(f"wrote {FLAGS.write_reference}")
    return
  runs = [(preset, policy, None) for preset in FLAGS.presets
          for policy in FLAGS.policies]
  runs += [(FLAGS.presets[0], "mixed_bfloat16", lever)
           for lever in FLAGS.levers]
  if FLAGS.rows:
    runs = [tuple(row.split(":") + [None])[:3] for row in FLAGS.rows]
  for _, _, lever in runs:  # every row's levers known before any runs
    _lever_settings(lever)
  rows = []
  for run in runs:
    rows.append(_in_own_process(*run))
    print(json.dumps(rows[-1]), flush=True)
  # Last: JAX in this process takes most of the GPU's memory for good.
  logits = None
  if FLAGS.reference:
    try:
      logits = gpu_check.check_logits(FLAGS.reference)
    except Exception as e:  # pylint: disable=broad-except
      logits = {"error": f"{type(e).__name__}: {e}"[:300]}
    print("logits:", json.dumps(logits), flush=True)
  os.makedirs(FLAGS.output_dir, exist_ok=True)
  with open(os.path.join(FLAGS.output_dir, "gpu_check.json"), "w") as f:
    json.dump({"training": rows, "logits": logits,
               "flags": {name: getattr(FLAGS, name) for name in (
                   "presets", "policies", "levers", *ROW_FLAGS,
                   "profile_dir")}}, f, indent=2)
  table = gpu_check.markdown(rows, logits)
  with open(os.path.join(FLAGS.output_dir, "gpu_check.md"), "w") as f:
    f.write(table)
  print(table)


if __name__ == "__main__":
  command.run(main, tensorflow=False,
              packages=("tf_transformer.", "bench."))
