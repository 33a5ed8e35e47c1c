"""bin/train.py and bin/average_checkpoints.py as a user runs them: a run
killed with SIGKILL resumes, two workers agree, TensorBoard has every tag."""

import json
import os
import re
import signal
import socket
import time

import numpy as np
import pytest
import tensorflow as tf

from conftest import run_script, start_script
from tf_transformer.run.runner import Runner
from tf_transformer.training import schedule
from tf_transformer.training.checkpoints import CheckpointError
from training_helpers import MECHANICS_FLAGS

# Slow (README.md's quick tier leaves it out): training runs through
# bin/train.py, as processes.
pytestmark = pytest.mark.slow

TINY = ["--config=tiny", "--dataset=numbers", "--numbers_train_size=300",
        "--vocab_size=400", "--max_length=32", "--batch_tokens=512",
        "--checkpoint_every_secs=0", "--alsologtostderr"]


def _start_train(model_dir, *args, stdout=os.devnull, stderr=os.devnull,
                 env=None):
  """bin/train.py on the tiny numbers task, started as `subprocess.Popen`
  starts it (`conftest.start_script`)."""
  return start_script("train.py", f"--model_dir={model_dir}", *TINY, *args,
                      stdout=stdout, stderr=stderr, env=env)


def _wait_for_step(log, step, timeout=300):
  """The highest step logged to file `log` once `step` is reached."""
  deadline = time.time() + timeout
  while time.time() < deadline:
    steps = [int(s) for s in re.findall(r"step (\d+)/\d+ loss",
                                        open(log).read())]
    if steps and max(steps) >= step:
      return max(steps)
    time.sleep(0.2)
  raise AssertionError(f"training did not reach step {step}: "
                       + open(log).read()[-2000:])


def _train(model_dir, *args, timeout=300):
  """bin/train.py on the tiny numbers task, run to its end
  (`conftest.run_script`)."""
  return run_script("train.py", f"--model_dir={model_dir}", *TINY, *args,
                    timeout=timeout)


def test_killed_run_resumes_from_its_last_checkpoint(tmp_path):
  model_dir = tmp_path / "run"
  args = ["--train_steps=400", "--checkpoint_every_steps=5",
          "--log_every_steps=1", "--eval_every_steps=0"]
  log = tmp_path / "train.log"
  process = _start_train(model_dir, *MECHANICS_FLAGS, *args, stderr=log)
  _wait_for_step(log, 13)
  process.send_signal(signal.SIGKILL)
  process.wait()
  latest = tf.train.latest_checkpoint(str(model_dir))
  saved_step = int(latest.rsplit("-", 1)[1])
  assert saved_step >= 10 and saved_step % 5 == 0
  reader = tf.train.load_checkpoint(latest)
  slots = [n for n, _ in tf.train.list_variables(latest)
           if n.startswith("optimizer/_variables")]
  assert slots, "optimizer slots are checkpointed"
  slot_value = reader.get_tensor(slots[0])

  resumed = _train(model_dir, *MECHANICS_FLAGS, *args[1:],
                   f"--train_steps={saved_step + 3}", timeout=600)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert f"at step {saved_step} " in resumed.stderr
  # The killed run's lock is stale: taken over, and said so.
  assert (f"{model_dir}/train.lock was left by a run that no longer holds it "
          f"(pid {process.pid} on host ") in resumed.stderr
  first = re.search(r"step (\d+)/\d+ loss \S+ lr (\S+)", resumed.stderr)
  assert int(first.group(1)) == saved_step + 1
  expected_lr = float(schedule.learning_rate(saved_step + 1, 64, 400))
  # Printed with 3 significant digits ("%.3g"): within half a unit of the
  # third, 5e-3 of the rate.
  np.testing.assert_allclose(float(first.group(2)), expected_lr, rtol=5e-3)
  final = tf.train.latest_checkpoint(str(model_dir))
  assert final.endswith(f"ckpt-{saved_step + 3}")
  assert np.any(tf.train.load_checkpoint(final).get_tensor(slots[0]) !=
                slot_value)


def _free_ports(count):
  sockets = [socket.socket() for _ in range(count)]
  for s in sockets:
    s.bind(("127.0.0.1", 0))
  ports = [s.getsockname()[1] for s in sockets]
  for s in sockets:
    s.close()
  return ports


def test_two_workers_on_loopback_agree(tmp_path):
  ports = _free_ports(2)
  cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
  processes = []
  for index in range(2):
    env = dict(os.environ, TF_CONFIG=json.dumps(
        {"cluster": cluster, "task": {"type": "worker", "index": index}}))
    processes.append(_start_train(
        tmp_path / "run", *MECHANICS_FLAGS, "--distribution=multi_worker",
        "--train_steps=3", "--checkpoint_every_steps=3",
        "--eval_every_steps=0", "--log_every_steps=1",
        stdout=tmp_path / f"worker{index}.out",
        stderr=tmp_path / f"worker{index}.err", env=env))
  outputs = [p.communicate(timeout=600) for p in processes]
  for process, (out, err) in zip(processes, outputs):
    assert process.returncode == 0, err[-3000:]
  fingerprints = [re.search(r"weights_fingerprint=(\S+)", out).group(1)
                  for out, _ in outputs]
  assert fingerprints[0] == fingerprints[1]
  for index, (_, err) in enumerate(outputs):  # TensorFlow's own line: a
    assert "MultiWorkerMirroredStrategy with cluster_spec" in err  # real
    assert "num_workers = 2" in err  # two-worker cluster
    # Each worker reads its own half of each epoch's batches.
    assert re.search(rf"input pipeline {index} of 2: \d+ of each epoch's "
                     r"\d+ batches", err), err[-3000:]
  assert tf.train.latest_checkpoint(str(tmp_path / "run")).endswith("ckpt-3")
  assert not os.path.exists(tmp_path / "run" / ".workers" / "worker_1")


def _tags(directory):
  from tensorboard.backend.event_processing import event_accumulator
  accumulator = event_accumulator.EventAccumulator(
      str(directory), size_guidance={"tensors": 0, "images": 0})
  accumulator.Reload()
  tags = accumulator.Tags()
  return set(tags["tensors"]) | set(tags["images"]) | set(tags["scalars"])


def test_tensorboard_has_every_tag_and_the_average_loads(tmp_path):
  model_dir = tmp_path / "run"
  flagfile = tmp_path / "flags.txt"
  flagfile.write_text("\n".join(TINY[:-1] + [
      f"--model_dir={model_dir}", "--train_steps=6", "--eval_every_steps=3",
      "--log_every_steps=3", "--checkpoint_every_steps=2",
      "--keep_checkpoints=3", "--average_checkpoints=3"]))
  result = run_script("train.py", f"--flagfile={flagfile}", timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "trained to step 6" in result.stdout
  train_tags = _tags(model_dir / "train")
  for tag in ("loss", "perplexity", "learning_rate", "tokens_per_sec",
              "gradient_norm", "_hparams_/session_start_info"):
    assert tag in train_tags, (tag, train_tags)
  dev_tags = _tags(model_dir / "dev")
  for tag in ("loss", "nll", "perplexity", "bleu", "exact_match",
              "sample_translations", "attention/encoder_self/layer_1",
              "attention/decoder_self/layer_2",
              "attention/encoder_decoder/layer_2"):
    assert tag in dev_tags, (tag, dev_tags)
  assert "attention/encoder_self/layer_3" not in dev_tags  # tiny: 2 layers
  for name in ("config.json", "vocabulary.model", "data_spec.json",
               "train_flags.txt", "data_stats.json"):
    assert (model_dir / name).exists()
  stats = json.loads((model_dir / "data_stats.json").read_text())
  assert stats["train"]["pairs"] == 300
  assert "dropped as longer than --max_length=32" in result.stderr

  averaged = run_script("average_checkpoints.py", f"--model_dir={model_dir}",
                        "--num_checkpoints=3",
                        f"--output_dir={tmp_path / 'avg'}")
  assert averaged.returncode == 0, averaged.stderr
  # ckpt-3: a step that evaluates is saved first (its weights may be the
  # best); the three newest are kept.
  assert "averaged 3 checkpoints: ckpt-3, ckpt-4, ckpt-6" in averaged.stdout
  assert (tmp_path / "avg" / "vocabulary.model").exists()
  refused = run_script("average_checkpoints.py", f"--model_dir={model_dir}",
                       "--num_checkpoints=5",
                       f"--output_dir={tmp_path / 'avg5'}")
  assert refused.returncode == 1
  assert "fewer than --num_checkpoints=5" in refused.stderr
  latest = run_script("average_checkpoints.py", f"--model_dir={model_dir}",
                      "--num_checkpoints=2", "--last_step=latest",
                      f"--output_dir={tmp_path / 'avg_refused'}")
  assert latest.returncode == 1
  assert "--last_step=latest: expected a step (an integer) or 'best'" in (
      latest.stderr)
  assert not (tmp_path / "avg_refused").exists()
  # --last_step: the newest at or before a step, or the best evaluation's
  # (the command passes it on to Runner.average, called here in process).
  runner = Runner(str(model_dir))
  bounded = runner.average(2, str(tmp_path / "avg_5"), last_step=5)
  assert [os.path.basename(p) for p in bounded.checkpoints] == [
      "ckpt-3", "ckpt-4"]
  best_step = json.loads((model_dir / "best" / "best.json").read_text())[
      "step"]
  at_best = runner.average(1, str(tmp_path / "avg_best"), last_step="best")
  assert [os.path.basename(p) for p in at_best.checkpoints] == [
      f"ckpt-{best_step}"]
  with pytest.raises(CheckpointError, match=re.escape(
      "has 1 checkpoint(s) at or before step 3, fewer than "
      "--num_checkpoints=2")):
    runner.average(2, str(tmp_path / "avg_refused"), last_step=3)
  with pytest.raises(CheckpointError, match=re.escape(
      f"--last_step=best: {tmp_path / 'avg'} has no best checkpoint")):
    Runner(str(tmp_path / "avg")).average(1, str(tmp_path / "x"),
                                          last_step="best")


def test_flag_errors_are_clear(tmp_path):
  result = run_script("train.py", f"--model_dir={tmp_path}", "--config=tiny",
                      "--keep_checkpoints=3", "--average_checkpoints=5")
  assert result.returncode == 1
  assert "--keep_checkpoints=3 is below --average_checkpoints=5" in \
      result.stderr
  assert "flags:" not in result.stderr + result.stdout  # one line, no help
  result = run_script("train.py", f"--model_dir={tmp_path}", "--config=tiny",
                      "--early_stopping=5", "--eval_every_steps=0")
  assert result.returncode == 1
  assert ("--early_stopping=5 counts dev evaluations: it needs "
          "--eval_every_steps > 0") in result.stderr
  result = run_script("train.py", f"--model_dir={tmp_path}", "--config=tiny",
                      "--dataset=", "--train_source=/nonexistent.en",
                      "--train_target=/nonexistent.de")
  assert result.returncode == 2
  assert "/nonexistent.en: no such file" in result.stderr
  assert "Traceback" not in result.stderr
  result = run_script("train.py", "--helpfull")
  assert "tf_transformer.data.data_flags" in result.stdout
  assert "--batch_tokens" in result.stdout
  # --help shows the flags of the shared modules too, and is no error.
  result = run_script("train.py", "--help")
  assert result.returncode == 0
  for flag in ("--dataset", "--train_source", "--dev_source", "--max_length",
               "--batch_tokens", "--[no]allow_recipe_change",
               "--early_stopping", "--early_stopping_min_delta",
               "--best_metric", "--eval_decoding", "--init_from"):
    assert f"\n  {flag}:" in result.stdout, flag
  result = run_script("train.py", "--no_such_flag")
  assert result.returncode == 1
  assert "Unknown command line flag 'no_such_flag'" in result.stderr
