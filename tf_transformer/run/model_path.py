"""What a command's `--model` names: an export or a run, told apart by its
files, without TensorFlow (so that a command refuses before it loads)."""

import os

SAVED_MODEL = "SavedModel"
CTRANSLATE2 = "CTranslate2"
RUN = "run"


def kind(path):
  """Which kind of model `path` holds.

  Args:
    path: a SavedModel version directory (bin/export.py), a CTranslate2
      directory (bin/export.py --format=ctranslate2), or a run directory
      (bin/train.py, an averaged or imported run: its config.json).
  Returns:
    SAVED_MODEL, CTRANSLATE2 or RUN; None where it is none of them. (A
    CTranslate2 directory has a config.json too; its model.bin decides.)
  """
  if os.path.isfile(os.path.join(path, "model.bin")):
    return CTRANSLATE2
  if os.path.isfile(os.path.join(path, "saved_model.pb")):
    return SAVED_MODEL
  if os.path.isfile(os.path.join(path, "config.json")):
    return RUN
  return None


def is_run(path):
  """Whether `path` is a run directory (see `kind`)."""
  return bool(path) and kind(path) == RUN
