"""bin/train.py under what clusters and users do: SIGTERM and Ctrl-C save at
the next step boundary and exit 143 / 130, on one device, under
MirroredStrategy and across two workers; a second run on the same
--model_dir is refused while the first lives; a NaN's advice works."""

import json
import os
import re
import signal

import pytest
import tensorflow as tf

from test_train_script import _free_ports, _start_train, _train
from test_train_script import _wait_for_step
from training_helpers import MECHANICS_FLAGS, ONE_LAYER

# Slow (README.md's quick tier leaves it out): training processes signalled,
# killed and resumed.
pytestmark = pytest.mark.slow

LONG = ["--train_steps=100000", "--checkpoint_every_steps=100000",
        "--eval_every_steps=0", "--log_every_steps=1", *MECHANICS_FLAGS]


def _start(model_dir, log, *args, env=None):
  """A training process whose stderr goes to `log`, its stdout to a file
  beside it (`communicate` gives it)."""
  return _start_train(model_dir, *args, stdout=f"{log}.out", stderr=log,
                      env=env)


def _saved_step(model_dir):
  return int(tf.train.latest_checkpoint(str(model_dir)).rsplit("-", 1)[1])


def _assert_saved_at_the_signals_step(log, saved, signal_name):
  """From the log's events, not the clock: the run saved at the step in
  flight when the signal came (the last one logged before the signal's
  line, or the next one, which was running), and logged no step past it."""
  text = open(log).read()
  before, after = text.split(f"{signal_name} received: stopping", 1)
  steps = lambda part: [int(s) for s in re.findall(r"step (\d+)/\d+ loss",
                                                    part)]
  last = max(steps(before), default=0)
  assert last <= saved <= last + 1, (last, saved)
  assert all(step <= saved for step in steps(after)), (saved, text[-2000:])


def test_sigterm_saves_at_the_next_step_and_a_second_run_is_refused(
    tmp_path):
  model_dir, log = tmp_path / "run", tmp_path / "first.log"
  first = _start(model_dir, log, *LONG)
  _wait_for_step(log, 5)
  second = _train(model_dir, *LONG)
  assert second.returncode == 4, second.stderr[-3000:]
  assert (f"train: error: {model_dir} is in use by another training run (pid "
          f"{first.pid} on host ") in second.stderr
  assert "Traceback" not in second.stderr
  assert first.poll() is None  # the first run goes on

  _wait_for_step(log, 1)
  first.send_signal(signal.SIGTERM)
  out, _ = first.communicate(timeout=120)
  assert first.returncode == 143, open(log).read()[-3000:]
  saved = _saved_step(model_dir)
  _assert_saved_at_the_signals_step(log, saved, "SIGTERM")
  assert out.strip() == (f"stopped by SIGTERM at step {saved}; saved "
                         f"{model_dir}/ckpt-{saved}; the same command resumes")
  assert "SIGTERM received: stopping after this step" in open(log).read()
  assert (model_dir / "train.lock").read_text() == ""  # released

  resumed = _train(model_dir, *LONG[1:], f"--train_steps={saved + 2}")
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert f"resumed from {model_dir}/ckpt-{saved} at step {saved} " in \
      resumed.stderr
  assert f"trained to step {saved + 2}" in resumed.stdout


def test_ctrl_c_under_mirrored_strategy_saves_and_exits_130(tmp_path):
  model_dir, log = tmp_path / "run", tmp_path / "train.log"
  process = _start(model_dir, log, *LONG, "--distribution=mirrored",
                   "--cpu_devices=2")
  _wait_for_step(log, 3)
  process.send_signal(signal.SIGINT)
  out, _ = process.communicate(timeout=120)
  # (How soon it leaves once saved is command.exit_now's: os._exit, not the
  # interpreter's teardown, which frees the input pipeline first.)
  assert process.returncode == 130, open(log).read()[-3000:]
  saved = _saved_step(model_dir)
  _assert_saved_at_the_signals_step(log, saved, "SIGINT")
  assert out.startswith(f"stopped by SIGINT at step {saved}; saved")
  assert "Traceback" not in open(log).read()


def test_sigterm_to_one_worker_stops_both_at_the_same_step(tmp_path):
  cluster = {"worker": [f"127.0.0.1:{p}" for p in _free_ports(2)]}
  processes = []
  for index in range(2):
    env = dict(os.environ, TF_CONFIG=json.dumps(
        {"cluster": cluster, "task": {"type": "worker", "index": index}}))
    processes.append(_start(tmp_path / "run", tmp_path / f"worker{index}.log",
                            "--distribution=multi_worker", *LONG, env=env))
  _wait_for_step(tmp_path / "worker1.log", 3)
  processes[1].send_signal(signal.SIGTERM)
  outputs = [p.communicate(timeout=300)[0] for p in processes]
  for index, process in enumerate(processes):
    assert process.returncode == 143, open(
        tmp_path / f"worker{index}.log").read()[-3000:]
  saved = _saved_step(tmp_path / "run")
  assert outputs[1].startswith(f"stopped by SIGTERM at step {saved}")
  assert outputs[0].startswith(
      f"stopped by a signal to another worker at step {saved}")


def test_nan_names_a_good_checkpoint_and_its_advice_works(tmp_path):
  model_dir = tmp_path / "run"
  args = [*MECHANICS_FLAGS, "--checkpoint_every_steps=1",
          "--eval_every_steps=0"]

  def train(*more):
    return _train(model_dir, *args, *more)

  assert train("--train_steps=2").returncode == 0
  refused = train("--train_steps=4",
                  f"--hparams={ONE_LAYER},learning_rate_scale=1e45")
  assert refused.returncode == 1
  assert "--allow_recipe_change" in refused.stderr
  assert "flags:" not in refused.stderr  # one line, not the whole --help
  exploded = train("--train_steps=4",
                   f"--hparams={ONE_LAYER},learning_rate_scale=1e45",
                   "--allow_recipe_change")
  assert exploded.returncode == 3, exploded.stderr[-3000:]
  assert (f"train: step 3: the update made weights or optimizer slots "
          f"non-finite (not saved); stopping. The last good checkpoint is "
          f"{model_dir}/ckpt-2") in exploded.stderr
  assert "--allow_recipe_change" in exploded.stderr
  assert _saved_step(model_dir) == 2
  assert not list(model_dir.glob("ckpt-3*"))  # never saved, not even part
  # The advice: the same weights, a lower learning rate.
  recovered = train("--train_steps=4",
                    f"--hparams={ONE_LAYER},learning_rate_scale=0.5",
                    "--allow_recipe_change")
  assert recovered.returncode == 0, recovered.stderr[-3000:]
  assert f"resumed from {model_dir}/ckpt-2 at step 2 " in recovered.stderr
  assert json.loads((model_dir / "config.json").read_text())["training"][
      "learning_rate_scale"] == 0.5
  architecture = train("--train_steps=5", f"--hparams={ONE_LAYER},d_ff=64",
                       "--allow_recipe_change")
  assert architecture.returncode == 1
  assert "'d_ff'" in architecture.stderr


def test_a_second_ctrl_c_stops_at_once_and_sigterm_repeats_are_ignored():
  from tf_transformer.training.interruption import StopRequest  # pylint: disable=g-import-not-at-top
  stop = StopRequest()
  assert not stop.requested and stop.exit_status == 0
  stop._handle(signal.SIGTERM, None)  # pylint: disable=protected-access
  stop._handle(signal.SIGTERM, None)  # pylint: disable=protected-access
  assert stop.requested and stop.signal_name == "SIGTERM"
  assert stop.exit_status == 143
  with pytest.raises(KeyboardInterrupt):
    stop._handle(signal.SIGINT, None)  # pylint: disable=protected-access
