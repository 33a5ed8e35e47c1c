"""Serving with TensorFlow Serving: the SavedModel (`translation_module`,
`export`), the REST and gRPC client (`client`) and the lines that it and
the commands print (`output`).

Release 1.1 moved the model formats to `tf_transformer.interop` and the
in-process translators to `tf_transformer.translators`. Their names here
(`from tf_transformer.serving import marian_import`) still import, with a
DeprecationWarning naming the new module, until release 2.0."""

import importlib
import warnings

MOVED = {"marian_import": "tf_transformer.interop.marian",
         "transformers_export": "tf_transformer.interop.marian",
         "marian_npz": "tf_transformer.interop.marian_npz",
         "opennmt_import": "tf_transformer.interop.opennmt_tf",
         "ct2_export": "tf_transformer.interop.ct2",
         "ct2_runtime": "tf_transformer.translators.ct2_runtime",
         "translator": "tf_transformer.translators.translator",
         "scorer": "tf_transformer.translators.scorer"}


def __getattr__(name):
  if name not in MOVED:
    raise AttributeError(
        f"module 'tf_transformer.serving' has no attribute {name!r}")
  warnings.warn(f"tf_transformer.serving.{name} is {MOVED[name]} since "
                "release 1.1", DeprecationWarning, stacklevel=2)
  module = globals()[name] = importlib.import_module(MOVED[name])
  return module
