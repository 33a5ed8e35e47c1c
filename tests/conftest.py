"""Shared test setup: quiet TensorFlow, deterministic seeds, small helpers."""

import os
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import pytest  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def _seed():
  keras.utils.set_random_seed(1234)
  yield
  keras.mixed_precision.set_global_policy("float32")


def run_script(name, *args, timeout=600, input_text=None, env=None):
  """Runs `bin/<name>` in a fresh interpreter; returns the CompletedProcess."""
  environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **(env or {}))
  return subprocess.run(
      [sys.executable, os.path.join(REPO, "bin", name), *args],
      capture_output=True, text=True, timeout=timeout, input=input_text,
      env=environment, cwd=REPO)
