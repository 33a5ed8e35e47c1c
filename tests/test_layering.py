"""Nothing imports upward: each package of tf_transformer imports only the
packages below it (the layering of docs/design.md). Read from the source,
function-level imports included."""

import ast
import glob
import os

import pytest

from conftest import REPO

ABOVE_DECODING = {"training", "serving", "interop", "translators", "run",
                  "cli"}
# Package -> the tf_transformer packages it must not import.
FORBIDDEN = {
    "layers": {"data", "decoding"} | ABOVE_DECODING,
    "data": {"layers", "decoding"} | ABOVE_DECODING,
    "decoding": ABOVE_DECODING,
    "training": ABOVE_DECODING - {"training"},
    "serving": ABOVE_DECODING - {"serving"},
    "interop": ABOVE_DECODING - {"interop"},
    "translators": {"training", "run", "cli"},
    "run": {"cli"},
}


def _imported_packages(path):
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read(), path)
  for node in ast.walk(tree):
    names = []
    if isinstance(node, ast.ImportFrom) and node.module:
      names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    elif isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    for name in names:
      parts = name.split(".")
      if parts[0] == "tf_transformer" and len(parts) > 1:
        yield parts[1], node.lineno


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_upward_imports(package):
  found = []
  for path in glob.glob(os.path.join(REPO, "tf_transformer", package, "*.py")):
    for imported, line in _imported_packages(path):
      if imported in FORBIDDEN[package]:
        found.append(f"{os.path.relpath(path, REPO)}:{line} imports "
                     f"tf_transformer.{imported}")
  assert not found, "\n".join(found)


def test_each_model_format_imports_only_what_the_formats_share():
  """interop/: one module a format; none imports another format's module,
  only interop/common.py."""
  found = []
  for path in glob.glob(os.path.join(REPO, "tf_transformer", "interop",
                                     "*.py")):
    with open(path, encoding="utf-8") as f:
      tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
      names = ([node.module] + [f"{node.module}.{a.name}" for a in node.names]
               if isinstance(node, ast.ImportFrom) and node.module else
               [a.name for a in node.names] if isinstance(node, ast.Import)
               else [])
      for name in names:
        parts = name.split(".")
        if parts[:2] == ["tf_transformer", "interop"] and len(parts) > 2 and (
            parts[2] != "common"):
          found.append(f"{os.path.relpath(path, REPO)}:{node.lineno} "
                       f"imports {name}")
  assert len(glob.glob(os.path.join(REPO, "tf_transformer", "interop",
                                    "*.py"))) >= 5  # the formats, common
  assert not found, "\n".join(found)


def test_the_package_never_imports_the_measuring_tools():
  """benchmarks/ stands beside the package and is not installed: nothing
  in tf_transformer may import its library, `bench`."""
  found = []
  for path in glob.glob(os.path.join(REPO, "tf_transformer", "**", "*.py"),
                        recursive=True):
    with open(path, encoding="utf-8") as f:
      tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
      names = ([node.module] if isinstance(node, ast.ImportFrom) else
               [a.name for a in node.names] if isinstance(node, ast.Import)
               else [])
      if any(name and name.split(".")[0] == "bench" for name in names):
        found.append(f"{os.path.relpath(path, REPO)}:{node.lineno}")
  assert not found, found


def test_the_moved_modules_old_names_still_import():
  """Release 1.1 moved the model formats to interop/ and the translators to
  translators/: `from tf_transformer.serving import marian_import` (as
  release 1.0's docs wrote it) still gives the module, with a
  DeprecationWarning naming where it is now."""
  import importlib  # pylint: disable=g-import-not-at-top
  serving = importlib.import_module("tf_transformer.serving")
  assert len(serving.MOVED) == 8
  for old, new in serving.MOVED.items():
    vars(serving).pop(old, None)
    with pytest.warns(DeprecationWarning, match=new.replace(".", r"\.")):
      module = getattr(serving, old)
    assert module is importlib.import_module(new)
  with pytest.raises(AttributeError, match="no attribute 'translators'"):
    getattr(serving, "translators")


def test_the_moved_modules_old_paths_still_import():
  """`from tf_transformer.serving.marian_import import from_transformers`
  and `import tf_transformer.serving.<old>` (module paths, which the import
  system looks up as submodules) give the moved module itself, with the
  DeprecationWarning; its own spec stays its own."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  code = """
import importlib, warnings
from tf_transformer import serving
for old, new in serving.MOVED.items():
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    module = importlib.import_module("tf_transformer.serving." + old)
  assert module is importlib.import_module(new), old
  assert module.__spec__.name == new, module.__spec__
  assert [str(w.message) for w in caught] == [
      f"tf_transformer.serving.{old} is {new} since release 1.1"], caught
  assert caught[0].category is DeprecationWarning
from tf_transformer.serving.marian_import import from_transformers
assert from_transformers.__module__ == "tf_transformer.interop.marian"
try:
  import tf_transformer.serving.nothing
except ModuleNotFoundError as e:
  assert e.name == "tf_transformer.serving.nothing"
print("ok")
"""
  done = subprocess.run([sys.executable, "-c", code], capture_output=True,
                        text=True, cwd=REPO, check=False)
  assert done.returncode == 0 and done.stdout.strip() == "ok", (
      done.stderr[-2000:])
