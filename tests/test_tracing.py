"""Every `tf.function` the package makes traces without AutoGraph: the
graph code writes its loops and branches as `tf.while_loop` and `tf.cond`,
so AutoGraph's rewrite of the Python source (about a third of an export's
time, docs/performance.md) buys nothing. Read from the source; the greedy and
sampling exports and the dev evaluation (tests/test_export.py,
tests/test_training.py) fail where graph code still leans on AutoGraph."""

import ast
import glob
import os

from conftest import REPO

SOURCES = sorted(glob.glob(os.path.join(REPO, "tf_transformer", "**", "*.py"),
                           recursive=True)
                 + glob.glob(os.path.join(REPO, "benchmarks", "**", "*.py"),
                             recursive=True))


def _is_tf_function(node):
  return (isinstance(node, ast.Attribute) and node.attr == "function"
          and isinstance(node.value, ast.Name) and node.value.id == "tf")


def _tf_functions(path):
  """(line, autograph keyword or None) of each `tf.function(...)` call and
  bare `@tf.function` decorator in the file."""
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read(), path)
  for node in ast.walk(tree):
    if isinstance(node, ast.Call) and _is_tf_function(node.func):
      autograph = [k.value for k in node.keywords if k.arg == "autograph"]
      yield node.lineno, autograph[0] if autograph else None
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      for decorator in node.decorator_list:
        if _is_tf_function(decorator):  # @tf.function, no arguments
          yield decorator.lineno, None


def test_every_tf_function_turns_autograph_off():
  found = {os.path.relpath(path, REPO): list(_tf_functions(path))
           for path in SOURCES}
  # The check sees them: the export's functions, the training steps.
  assert len(found["tf_transformer/serving/translation_module.py"]) >= 8
  assert len(found["tf_transformer/training/steps.py"]) >= 1
  with_autograph = [
      f"{path}:{line}" for path, calls in sorted(found.items())
      for line, autograph in calls
      if not (isinstance(autograph, ast.Constant) and autograph.value is False)]
  assert not with_autograph, (
      f"tf.function without autograph=False: {', '.join(with_autograph)}")
