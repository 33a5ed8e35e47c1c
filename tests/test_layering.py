"""Nothing imports upward: each package of tf_transformer imports only the
packages below it (the layering of docs/design.md). Read from the source,
function-level imports included."""

import ast
import glob
import os

import pytest

from conftest import REPO

# Package -> the tf_transformer packages it must not import.
FORBIDDEN = {
    "layers": {"data", "decoding", "training", "serving", "run", "cli"},
    "data": {"layers", "decoding", "training", "serving", "run", "cli"},
    "decoding": {"training", "serving", "run", "cli"},
    "training": {"serving", "run", "cli"},
    "serving": {"training", "run", "cli"},
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
