"""Serving with TensorFlow Serving: the SavedModel (`translation_module`,
`export`), the REST and gRPC client (`client`) and the lines that it and
the commands print (`output`).

Release 1.1 moved the model formats to `tf_transformer.interop` and the
in-process translators to `tf_transformer.translators`. Their old names
still import, as attributes (`from tf_transformer.serving import
marian_import`) and as module paths (`from
tf_transformer.serving.marian_import import from_transformers`,
`import tf_transformer.serving.ct2_runtime`), with a DeprecationWarning
naming the new module, until release 2.0."""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

MOVED = {"marian_import": "tf_transformer.interop.marian",
         "transformers_export": "tf_transformer.interop.marian",
         "marian_npz": "tf_transformer.interop.marian_npz",
         "opennmt_import": "tf_transformer.interop.opennmt_tf",
         "ct2_export": "tf_transformer.interop.ct2",
         "ct2_runtime": "tf_transformer.translators.ct2_runtime",
         "translator": "tf_transformer.translators.translator",
         "scorer": "tf_transformer.translators.scorer"}


def _moved(name, stacklevel):
  """The module `name` (a key of MOVED) now is, with the warning."""
  warnings.warn(f"tf_transformer.serving.{name} is {MOVED[name]} since "
                "release 1.1", DeprecationWarning, stacklevel=stacklevel)
  return importlib.import_module(MOVED[name])


def __getattr__(name):
  if name not in MOVED:
    raise AttributeError(
        f"module 'tf_transformer.serving' has no attribute {name!r}")
  module = globals()[name] = _moved(name, 3)
  return module


class _OldPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  """Imports `tf_transformer.serving.<old name>` as the module it moved
  to: the import system asks finders for submodules, never the package's
  `__getattr__`."""

  def find_spec(self, fullname, path=None, target=None):
    del path, target
    package, _, name = fullname.rpartition(".")
    if package != __name__ or name not in MOVED:
      return None
    return importlib.util.spec_from_loader(fullname, self)

  def create_module(self, spec):
    # The moved module itself: `import tf_transformer.serving.ct2_runtime`
    # then names the same object as `tf_transformer.translators.ct2_runtime`.
    module = _moved(spec.name.rpartition(".")[2], 4)
    self._specs = getattr(self, "_specs", {})
    self._specs[spec.name] = (module.__spec__, module.__loader__)
    return module

  def exec_module(self, module):
    # Already executed, under its own name; the import system has just set
    # its __spec__ to the old path's: its own again.
    module.__spec__, module.__loader__ = self._specs.pop(module.__spec__.name)


if not any(isinstance(finder, _OldPaths) for finder in sys.meta_path):
  sys.meta_path.append(_OldPaths())
