"""BUILD cannot drift from the code: every module, script and test file has a
Bazel target. BUILD is evaluated as Starlark-compatible Python, with the
rules replaced by recorders and `glob` by a real file glob."""

import glob as glob_lib
import os

from conftest import REPO


def _evaluate_build():
  targets = []

  def rule(kind):
    def record(**attributes):
      targets.append((kind, attributes))
    return record

  def glob(patterns, exclude=()):
    found = set()
    for pattern in patterns:
      found.update(os.path.relpath(p, REPO) for p in glob_lib.glob(
          os.path.join(REPO, pattern), recursive=True))
    return sorted(found - set(exclude))

  with open(os.path.join(REPO, "BUILD")) as f:
    source = f.read()
  exec(compile(source, "BUILD", "exec"), {  # pylint: disable=exec-used
      "package": lambda **_: None, "glob": glob,
      "py_library": rule("py_library"), "py_binary": rule("py_binary"),
      "py_test": rule("py_test")})
  return targets


def _sources(targets, kind):
  return {src for k, attributes in targets if k == kind
          for src in attributes["srcs"]}


def _files(pattern):
  return {os.path.relpath(p, REPO) for p in glob_lib.glob(
      os.path.join(REPO, pattern), recursive=True)}


def test_every_module_is_in_the_library():
  missing = (_files("tf_transformer/**/*.py") | _files(
      "benchmarks/bench/*.py")) - _sources(_evaluate_build(), "py_library")
  assert not missing, f"modules without a py_library target: {missing}"


def test_every_script_has_a_py_binary():
  targets = _evaluate_build()
  mains = {a["main"] for k, a in targets if k == "py_binary"}
  scripts = _files("bin/*.py") | _files("benchmarks/*.py")
  missing = scripts - mains
  assert not missing, f"scripts without a py_binary target in BUILD: {missing}"
  assert mains <= scripts, "py_binary for a script that is gone"


def test_every_test_file_has_a_py_test():
  targets = _evaluate_build()
  tested = {a["args"][0].split(" ")[-1].rstrip(")") for k, a in targets
            if k == "py_test"}
  missing = _files("tests/test_*.py") - tested
  assert not missing, f"test files without a py_test target in BUILD: {missing}"
  assert tested <= _files("tests/test_*.py"), "py_test for a file that is gone"
  for kind, attributes in targets:
    if kind == "py_test":
      assert attributes["main"] == "tests/bazel_pytest.py"
      assert "tests/conftest.py" in attributes["srcs"]
