"""The SavedModel that TensorFlow Serving loads: a `TranslationModule`
(decoding/translation_module.py: text in, translations out, tokenization and
search in the graph) saved as the next integer version of an export folder,
the layout TF Serving watches, with these signatures:

- `serving_default`: text [batch] string -> translation, score;
- `nbest`: text -> translations [batch, n], scores [batch, n];
- `ids`: source_ids [batch, length] int32 -> target_ids, score;
- `attention`: text -> translation, tokens and attention weights.

`count_input_tokens` and `source_ids` are saved too, as functions (TF
Serving does not expose them; bin/translate.py uses the first to warn about
cut inputs, and the second gives a Python client the ids `ids` takes).
"""

import os

import tensorflow as tf
from absl import logging

from tf_transformer.decoding.translation_module import TranslationModule


def next_version_dir(export_dir):
  """export_dir/<integer>, one above the highest version already there."""
  versions = [int(name) for name in tf.io.gfile.listdir(export_dir)
              if name.strip("/").isdigit()] if tf.io.gfile.exists(
                  export_dir) else []
  return os.path.join(export_dir, str(max(versions, default=0) + 1))


def export(module: TranslationModule, export_dir: str) -> str:
  """Writes the next version of `export_dir`; returns its path."""
  path = next_version_dir(export_dir)
  # Saving sets absl's verbosity to FATAL and back with set_verbosity, which
  # pins absl's logger at an explicit level (WARNING unless flags said
  # otherwise): the INFO lines of whatever runs next in this process would
  # vanish. Keep the caller's level.
  absl_logger = logging.get_absl_logger()
  level = absl_logger.level
  try:
    tf.saved_model.save(module, path, signatures={
        "serving_default": module.serve, "nbest": module.nbest,
        "ids": module.translate_ids, "attention": module.attention})
  finally:
    absl_logger.setLevel(level)
  return path
