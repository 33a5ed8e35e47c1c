"""Shared test setup: quiet TensorFlow, deterministic seeds, small helpers."""

import fcntl
import functools
import gc
import os
import shutil
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _cores_per_worker():
  """The cores each pytest-xdist worker gets (`-n 2` on 2 cores: 1)."""
  workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
  return max(1, len(os.sched_getaffinity(0)) // workers)


# Each worker's TensorFlow (and the bin/ processes it starts, which inherit
# the variable) sizes its intra-op pool to its share of the cores, not to all
# of them: with two workers on two cores, four spinning threads fought for
# two, and the suite took 8% longer.
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", str(_cores_per_worker()))
# The same for PyTorch's OpenMP pool (the Transformers references, Keras'
# torch backend): its idle threads spin between the tiny ops, and took some
# 35 CPU-s of the other worker's core in the four files that run PyTorch.
os.environ.setdefault("OMP_NUM_THREADS", str(_cores_per_worker()))

from absl import logging as absl_logging  # noqa: E402
import command_zygote  # noqa: E402
import keras  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

# The imports' objects (some 400,000) are never garbage: kept out of the
# collector's full collections, which the tests' graphs set off often.
gc.freeze()

# Eight logical CPU devices, so MirroredStrategy runs without GPUs (as 8 GPUs
# in the paper). Must happen before any op runs; ops default to /cpu:0.
NUM_CPU_DEVICES = 8
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0],
    [tf.config.LogicalDeviceConfiguration()] * NUM_CPU_DEVICES)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The measuring tools' library (benchmarks/bench), which is not installed.
sys.path.insert(0, os.path.join(REPO, "benchmarks"))


def pytest_configure(config):
  config.addinivalue_line(
      "markers", "slow: a job or a bin/ command end to end, an export "
      "loaded in a fresh process, another Keras backend, a measuring tool, "
      "an XLA compilation, or a costly case of a parametrized comparison "
      "beyond one for each kernel path, dtype and engine; README.md's quick "
      "tier (-m \"not slow\") leaves these out")
  config.addinivalue_line(
      "markers", "numeric: compares numbers two kernels compute (two paths "
      "through one model, a model against a reference, a bound from the "
      "dtype's rounding); README.md's test command runs those of the quick "
      "tier again under ONEDNN_MAX_CPU_ISA=AVX2 (oneDNN's kernels for an "
      "AVX2-only CPU) and TF_ENABLE_ONEDNN_OPTS=0 (TensorFlow's Eigen "
      "kernels), so that a change made on one kind of CPU meets the others' "
      "sums before it lands (the slow ones make the same comparisons through "
      "commands and fresh processes: left to the host's own kernels, within "
      "CI's time)")
  config.addinivalue_line(
      "markers", "bfloat16: runs bfloat16 kernels. Left out of the "
      "ONEDNN_MAX_CPU_ISA=AVX2 run: TensorFlow sends bfloat16 to oneDNN by "
      "the CPU's own flags (AVX512_BF16, AMX), and a oneDNN capped below "
      "them has no bfloat16 kernel (a segmentation fault); an AVX2-only CPU "
      "runs bfloat16 on Eigen's kernels, which the TF_ENABLE_ONEDNN_OPTS=0 "
      "run covers")


@pytest.fixture(autouse=True)
def _seed():
  keras.utils.set_random_seed(1234)
  # tf.saved_model.save pins absl's logger at an explicit level (WARNING):
  # a test that saves would hide the INFO lines later tests read.
  absl_level = absl_logging.get_absl_logger().level
  yield
  keras.mixed_precision.set_global_policy("float32")
  absl_logging.get_absl_logger().setLevel(absl_level)


_ZYGOTE = command_zygote.Zygote(dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))


def run_script(name, *args, timeout=600, input_text=None, env=None,
               fresh=False):
  """Runs `bin/<name>` (or `name`, a path with a folder, such as
  benchmarks/benchmark.py) as `python SCRIPT ARGS`; returns the
  CompletedProcess. In a fork of a process that has imported TensorFlow
  (tests/command_zygote.py), unless `fresh` or `env` asks for a fresh
  interpreter: for what a command prints while TensorFlow loads, or
  variables TensorFlow reads at import."""
  path = os.path.join(REPO, name if "/" in name else os.path.join("bin",
                                                                  name))
  if not (fresh or env):
    return _ZYGOTE.run([path, *args], REPO, input_text, timeout)
  environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
  return subprocess.run(
      [sys.executable, path, *args], capture_output=True, text=True,
      timeout=timeout, input=input_text, env=environment, cwd=REPO)


def start_script(name, *args, stdout=os.devnull, stderr=os.devnull,
                 env=None):
  """Starts `bin/<name>` ARGS as `subprocess.Popen` would, in a fork of the
  command zygote, its stdout and stderr written to the files named; returns
  a Popen-like `command_zygote.Started` at once: for tests that signal a
  command or run two at once. `env`: its whole environment (variables read
  at TensorFlow's import take the zygote's values)."""
  return _ZYGOTE.start([os.path.join(REPO, "bin", name), *args], REPO,
                       stdout, stderr, env)


@functools.cache
def load_saved_model(path):
  """`tf.saved_model.load(path)`, once per test process: these tests only
  call an export's signatures, and each load of the tiny export costs about
  1.7 CPU-s, and each signature's first call more."""
  return tf.saved_model.load(str(path))


def made_once(tmp_path_factory, name, make):
  """A copy, this test process's own, of the folder `make(folder)` fills
  once for the whole session: the first pytest-xdist worker to ask makes
  it while the others wait (a lock in the folder the workers share), so
  the suite trains and exports its shared fixtures once, not once per
  worker. Copies, as tests write into these runs (a shortlist, exports)."""
  base = tmp_path_factory.getbasetemp()
  shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
  made = shared / f"once_{name}"
  with open(shared / f"once_{name}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not (shared / f"once_{name}.complete").exists():
      shutil.rmtree(made, ignore_errors=True)
      made.mkdir()
      make(made)
      (shared / f"once_{name}.complete").touch()
  copy = tmp_path_factory.mktemp(name)
  shutil.copytree(made, copy, dirs_exist_ok=True)
  return copy


# The suite's trained model, checked in (tests/data/trained_numbers/make.py
# wrote it): every host compares the same weights.
TRAINED_NUMBERS_RUN = os.path.join(REPO, "tests", "data", "trained_numbers",
                                   "run")


@pytest.fixture(scope="session")
def trained_numbers_run(tmp_path_factory):
  """A copy, this test process's own, of the checked-in run directory of a
  tiny model trained 400 steps on the numbers task (its searches end on
  EOS early and unevenly, as a real model's do): tests write into it (a
  shortlist, exports)."""
  return made_once(tmp_path_factory, "trained_numbers",
                   lambda folder: shutil.copytree(
                       TRAINED_NUMBERS_RUN, folder, dirs_exist_ok=True))


# `untrained_export`'s --max_length_offset.
UNTRAINED_EXPORT_OFFSET = 8


@pytest.fixture(scope="session")
def untrained_export(tmp_path_factory):
  """(run directory, its export's version folder) of an untrained tiny
  model, exported by bin/export.py with --max_length_offset=
  UNTRAINED_EXPORT_OFFSET, once per session: the export that export,
  translation, plotting and serving tests share (read only: a test that
  writes beside it copies it first)."""
  from training_helpers import write_run_and_export  # pylint: disable=g-import-not-at-top
  folder = made_once(tmp_path_factory, "untrained_export",
                      lambda folder: write_run_and_export(
                          folder, UNTRAINED_EXPORT_OFFSET))
  return folder / "run", folder / "saved" / "numbers" / "1"


# `trained_export`'s options: inputs up to 24 subwords (above the numbers'
# longest, 18) and outputs of input + 10. Tests that export the same run to
# compare with it export with these.
TRAINED_EXPORT = dict(max_input_tokens=24, max_decode_length_offset=10)


@pytest.fixture(scope="session")
def trained_export(trained_numbers_run, tmp_path_factory):
  """`trained_numbers_run` exported as a SavedModel version (beam 4, an
  input limit of 24 subwords, above the numbers' longest 18, and outputs of
  input + 10), once per session."""
  from tf_transformer.run.runner import Runner  # pylint: disable=g-import-not-at-top
  folder = made_once(
      tmp_path_factory, "trained_export", lambda folder: Runner(
          str(trained_numbers_run)).export(
              str(folder / "numbers"), **TRAINED_EXPORT))
  return str(folder / "numbers" / "1")
