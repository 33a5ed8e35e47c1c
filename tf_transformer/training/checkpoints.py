"""Checkpoints that survive a kill, and checkpoint averaging (section 6.1).

`Checkpointer` saves the model, the optimizer (slots and step) and the input
position every N steps and/or N seconds through `tf.train.CheckpointManager`,
whose index file is only updated after a checkpoint is fully written: a run
killed at any moment restarts from the last complete checkpoint. A damaged
newest checkpoint is skipped with a warning in favour of the one before.

`average_checkpoints` averages the model variables (not the optimizer slots
or the step) of the last N checkpoints into a new model directory.
"""

import os
import shutil
import time

import numpy as np
import tensorflow as tf
from absl import logging

from tf_transformer import whole_dir

# What a model directory holds besides checkpoints; copied by averaging.
# (shortlist.npz: the run's vocabulary shortlist, bin/build_shortlist.py;
# marian/: an imported model's vocabulary, data/marian_vocabulary.py.)
RUN_FILES = ("config.json", "vocabulary.model", "data_spec.json",
             "data_stats.json", "shortlist.npz", "marian/source.spm",
             "marian/target.spm", "marian/vocab.json")


def copy_run_file(source, target):
  """Copies a `RUN_FILES` file, making its folder (marian/) first."""
  tf.io.gfile.makedirs(os.path.dirname(target))
  tf.io.gfile.copy(source, target, overwrite=True)


# TensorFlow logs this at INFO on every save; say what was saved instead.
logging.get_absl_logger().addFilter(
    lambda record: not str(record.msg).startswith("Sharding callback"))

# What a save killed midway leaves: TensorFlow's shard folder, its atomic
# write of the index file, and run_dir's atomic writes.
STRAY_PATTERNS = ("ckpt-*_temp", "checkpoint.tmp*", "*.json.tmp",
                  "train_flags.txt.tmp", "best/*.tmp", "best/checkpoint.tmp*")


class CheckpointError(RuntimeError):
  """No usable checkpoint, or too few to average."""


class Checkpointer:
  """Saves and restores one run's state under `directory`."""

  def __init__(self, directory, keep=20, every_steps=None, every_secs=600,
               is_chief=True, worker_id=0, optional=None, **objects):
    """`objects` must all be in a checkpoint to restore it; `optional` ones
    (added after checkpoints were written) are restored when present."""
    optional = optional or {}
    self.checkpoint = tf.train.Checkpoint(**objects, **optional)
    self._required = tf.train.Checkpoint(**objects)
    self._optional = tf.train.Checkpoint(**optional)
    self.directory = directory
    # Non-chief workers of a multi-worker run must save too (the save is a
    # collective) but into a scratch directory that is deleted.
    self.is_chief = is_chief
    write_dir = directory if is_chief else os.path.join(
        directory, ".workers", f"worker_{worker_id}")
    self.manager = tf.train.CheckpointManager(
        self.checkpoint, write_dir, max_to_keep=keep)
    self.every_steps = every_steps
    self.every_secs = every_secs
    self.last_save_time = time.time()
    self.last_save_step = None

  def restore(self):
    """Restores the newest readable checkpoint; returns its path or None."""
    candidates = list(reversed(checkpoint_paths(self.directory)))
    for i, path in enumerate(candidates):
      try:
        status = self._required.restore(path)
        status.assert_existing_objects_matched().expect_partial()
        self._optional.restore(path).expect_partial()
      except Exception as e:  # pylint: disable=broad-except
        # Truncated or missing files surface as OpError, IndexError,
        # ValueError or AssertionError: all mean "damaged", try the previous.
        logging.warning("checkpoint %s is damaged (%s: %s); trying the one "
                        "before", path, type(e).__name__,
                        str(e).splitlines()[0][:200])
        continue
      if i:
        logging.warning("resumed from %s, %d newer checkpoint(s) unreadable",
                        path, i)
      self.last_save_step = step_of(path)
      return path
    return None

  def remove_stray_files(self):
    """Deletes what a save killed midway leaves (`STRAY_PATTERNS`); only a
    run that holds the directory's lock may call this. Returns the paths."""
    stray = [path for pattern in STRAY_PATTERNS for path in
             tf.io.gfile.glob(os.path.join(self.directory, pattern))]
    for path in stray:
      if tf.io.gfile.isdir(path):
        tf.io.gfile.rmtree(path)
      else:
        tf.io.gfile.remove(path)
      logging.info("removed %s, left by a save that was killed midway", path)
    return stray

  def latest(self):
    """The newest complete checkpoint in the run directory, or None."""
    return tf.train.latest_checkpoint(self.directory)

  def due(self, step):
    if self.every_steps and step % self.every_steps == 0:
      return True
    return bool(self.every_secs) and (
        time.time() - self.last_save_time >= self.every_secs)

  def save(self, step):
    """Saves now (every worker must call this in a multi-worker run)."""
    if step == self.last_save_step:
      return None
    path = self.manager.save(checkpoint_number=step)
    self.last_save_time, self.last_save_step = time.time(), step
    if self.is_chief:
      logging.info("saved %s", path)
    else:
      shutil.rmtree(self.manager.directory, ignore_errors=True)
    return path


def step_of(path):
  """The step a checkpoint path was saved at: .../ckpt-1200 -> 1200."""
  return int(path.rsplit("-", 1)[-1])


def checkpoint_paths(model_dir, last_step=None):
  """The run's kept checkpoints, oldest first; with `last_step`, only those
  saved at or before that step."""
  state = tf.train.get_checkpoint_state(model_dir)
  paths = list(state.all_model_checkpoint_paths) if state else []
  if last_step is not None:
    paths = [p for p in paths if step_of(p) <= last_step]
  return paths


def average_checkpoints(model, model_dir, num_checkpoints, output_dir,
                        last_step=None):
  """Averages the model variables of the last `num_checkpoints` checkpoints
  of `model_dir` (section 6.1) into `output_dir` (with the run's config and
  vocabulary).

  Args:
    model: a built model of the run's config; its variables are overwritten.
    model_dir: the training run's directory.
    num_checkpoints: how many checkpoints to average.
    output_dir: the new model directory.
    last_step: None, or average the newest checkpoints saved at or before
      this step (as fairseq's `--checkpoint-upper-bound`), e.g. the best
      dev evaluation's, for a run that went on past its best.
  Returns:
    (the output checkpoint path, the averaged checkpoint paths).
  Raises:
    CheckpointError: too few checkpoints, or `output_dir` is `model_dir`.
  """
  paths = checkpoint_paths(model_dir, last_step)
  bound = "" if last_step is None else f" at or before step {last_step}"
  if num_checkpoints < 1:
    raise CheckpointError(f"--num_checkpoints={num_checkpoints}: must be >= 1")
  if len(paths) < num_checkpoints:
    raise CheckpointError(
        f"{model_dir} has {len(paths)} checkpoint(s){bound}, fewer than "
        f"--num_checkpoints={num_checkpoints}; train longer or average fewer")
  if os.path.abspath(output_dir) == os.path.abspath(model_dir):
    raise CheckpointError("--output_dir must differ from --model_dir")
  chosen = paths[-num_checkpoints:]
  checkpoint = tf.train.Checkpoint(model=model)
  total = None
  for path in chosen:
    checkpoint.read(path).expect_partial()
    values = [np.asarray(v.numpy(), np.float64) for v in model.weights]
    total = values if total is None else [t + v for t, v in zip(total, values)]
  for variable, value in zip(model.weights, total):
    variable.assign((value / len(chosen)).astype(variable.dtype))
  step = step_of(chosen[-1])
  # What else the folder holds (an export, a shortlist table built for it)
  # stays; its old checkpoints go, as the average replaces them.
  with whole_dir.written(output_dir, carry=lambda name: not name.startswith(
      ("ckpt-", "checkpoint"))) as writing:
    for name in RUN_FILES:
      source = os.path.join(model_dir, name)
      if tf.io.gfile.exists(source):
        copy_run_file(source, os.path.join(writing, name))
    tf.train.CheckpointManager(checkpoint, writing, max_to_keep=1).save(
        checkpoint_number=step)
  return os.path.join(output_dir, f"ckpt-{step}"), chosen
