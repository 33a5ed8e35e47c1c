"""The SavedModel that TensorFlow Serving loads: a `TranslationModule`
(serving/translation_module.py: text in, translations out, tokenization and
search in the graph) saved as the next integer version of an export folder,
the layout TF Serving watches, with these signatures:

- `serving_default`: text [batch] string -> translation, score;
- `nbest`: text -> translations [batch, n], scores [batch, n];
- `ids`: source_ids [batch, length] int32 -> target_ids, score;
- `attention`: text -> translation, score, tokens and attention weights;
- `alignment`: text -> translation, score, tokens and the encoder-decoder
  attention averaged over heads, [batch, layers, T, S]: word alignments
  (`decoding/alignment.py`; bin/translate.py and bin/serving_client.py
  --alignment);
- `translate_with_prefix`: text, prefix [batch] strings -> translation,
  score: translations that start with the given prefix (autocompletion);
- `score`: source, target [batch] strings -> log_prob [batch],
  token_log_probs [batch, T], lengths [batch]: log P(target | source) under
  teacher forcing, to rerank or filter (`decoding/scoring.py`).

A version is written whole or not at all: into `.writing-<N>-<pid>` beside
the versions (a name TF Serving, which loads integer names only, and
`next_version_dir` ignore), then renamed to `<N>` in one step. A write
stopped by a kill leaves only that folder, which the next export removes and
says so; one stopped by an error (a full disk) removes it itself.

`count_input_tokens` and `source_ids` are saved too, as functions (TF
Serving does not expose them; bin/translate.py uses the first to warn about
cut inputs, and the second gives a Python client the ids `ids` takes).

An export in bfloat16 (`model.with_dtype_policy(model, "bfloat16")`) keeps
its weights in bfloat16 and multiplies in bfloat16; the signatures and their
float32 scores are the same. It is fast only where the serving CPU has
bfloat16 instructions (AVX512_BF16 or AMX; every current GPU has bfloat16):
elsewhere TensorFlow emulates them, slower than float32, and
`bfloat16_warning` says so; `float32_note` says where a float32 export's
CPU has them.
"""

import logging as python_logging
import os
import shutil
import sys

import tensorflow as tf
from absl import logging

from tf_transformer import cpu
from tf_transformer.serving.translation_module import TranslationModule


WRITING = ".writing-"


def _running(pid):
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # another user's process
    return True
  return True


def remove_leftovers(export_dir):
  """Removes the `.writing-*` folders in `export_dir` of exports that were
  stopped (by a kill: their process is gone); returns their paths."""
  removed = []
  if not os.path.isdir(export_dir):
    return removed
  for name in sorted(os.listdir(export_dir)):
    if not name.startswith(WRITING):
      continue
    pid = name.rsplit("-", 1)[-1]
    if pid.isdigit() and _running(int(pid)) and int(pid) != os.getpid():
      continue  # an export under way in another process
    shutil.rmtree(os.path.join(export_dir, name), ignore_errors=True)
    removed.append(os.path.join(export_dir, name))
  return removed


def versions(export_dir):
  """The integer versions in `export_dir`, ascending ([] where none)."""
  return sorted(int(name.strip("/")) for name in (
      tf.io.gfile.listdir(export_dir) if tf.io.gfile.exists(export_dir)
      else ()) if name.strip("/").isdigit())


def next_version_dir(export_dir):
  """export_dir/<integer>, one above the highest version already there."""
  return os.path.join(export_dir, str(max(versions(export_dir), default=0)
                                      + 1))


def bfloat16_warning(cpuinfo=cpu.CPUINFO):
  """None where this CPU multiplies bfloat16 natively, else one line that
  says it does not (or could not be checked)."""
  found = cpu.bfloat16_flags(cpuinfo)
  if found is None:
    return (f"could not read {cpuinfo} to check this CPU for bfloat16 "
            "instructions (AVX512_BF16, AMX): without them bfloat16 is "
            "emulated, slower than float32")
  if found:
    return None
  return ("this CPU has neither AVX512_BF16 nor AMX: a bfloat16 export is "
          "emulated here, slower than float32; serve it on a CPU that has "
          "them, or on a GPU")


def float32_note(cpuinfo=cpu.CPUINFO):
  """For a float32 export: one line where this CPU multiplies bfloat16
  natively (the --dtype=bfloat16 export may then serve faster), else
  None."""
  found = cpu.bfloat16_flags(cpuinfo)
  if not found:
    return None
  return (f"this CPU has {' and '.join(found)}: "
          "--dtype=bfloat16 may serve faster here (measure both with "
          "benchmarks/benchmark.py --sections=serving in a clone; "
          "docs/serving.md#bfloat16)")


class _CaptureRenames(python_logging.Filter):
  """Drops TensorFlow's INFO line, thousands of characters long, that a
  signature function's inputs `input_1`, `input_2`, ... will be renamed
  `cond_input_1`, ...: they are the tensors its `tf.cond` branches capture,
  not the signature's inputs, which keep their names (`text`, ...)."""

  def filter(self, record):
    return "with unsupported characters which will be renamed" not in (
        record.getMessage())


def export(module: TranslationModule, export_dir: str, on_stage=None) -> str:
  """Writes the next version of `export_dir`, whole (see above); returns
  its path. `on_stage(text)` hears of leftovers removed."""
  for leftover in remove_leftovers(export_dir):
    if on_stage:
      on_stage(f"removed {leftover}, left by an export that was stopped")
  version = os.path.basename(next_version_dir(export_dir))
  writing = os.path.join(export_dir, f"{WRITING}{version}-{os.getpid()}")
  # Saving sets absl's verbosity to FATAL and back with set_verbosity, which
  # pins absl's logger at an explicit level (WARNING unless flags said
  # otherwise): the INFO lines of whatever runs next in this process would
  # vanish. Keep the caller's level.
  absl_logger = logging.get_absl_logger()
  level = absl_logger.level
  renames = _CaptureRenames()
  absl_logger.addFilter(renames)
  # Saving converts each signature's wrapper with AutoGraph, which writes
  # the converted module to a temporary file and imports it: Python would
  # leave that module's bytecode in TMPDIR's __pycache__ for good.
  dont_write_bytecode = sys.dont_write_bytecode
  sys.dont_write_bytecode = True
  try:
    tf.saved_model.save(module, writing, signatures={
        "serving_default": module.serve, "nbest": module.nbest,
        "ids": module.translate_ids, "attention": module.attention,
        "alignment": module.alignment, "score": module.score,
        "forced_alignment": module.forced_alignment,
        "translate_with_prefix": module.translate_with_prefix})
  except BaseException:
    shutil.rmtree(writing, ignore_errors=True)
    raise
  finally:
    sys.dont_write_bytecode = dont_write_bytecode
    absl_logger.setLevel(level)
    absl_logger.removeFilter(renames)
  return _move_in(writing, export_dir)


def _move_in(writing, export_dir):
  """Renames the folder `writing` to the next free version of `export_dir`
  (another export may have taken the one chosen at the start)."""
  while True:
    path = next_version_dir(export_dir)
    try:
      os.rename(writing, path)
      return path
    except OSError:
      if not os.path.isdir(path):
        raise
