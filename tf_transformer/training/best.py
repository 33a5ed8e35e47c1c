"""The best checkpoint by a dev metric, and early stopping: what OpenNMT-tf
(`export_on_best`, `early_stopping`), fairseq (`--best-checkpoint-metric`,
`--patience`) and Marian (`--keep-best`, `--early-stopping`) give.

Every dev evaluation is appended to MODEL_DIR/evaluations.json. When one
beats every earlier one on `metric` (dev BLEU or exact match, higher is
better, or dev loss, lower is better; equal values are ranked by the lower
dev loss, `rank`), the checkpoint of its step (saved just before the
evaluation) is copied into MODEL_DIR/best/, a model directory of its own
(config, vocabulary, the checkpoint, and best.json naming its step and dev
scores) that the rolling `--keep_checkpoints` never deletes.
`bin/export.py --model_dir=RUN --checkpoint=best` exports it.

Early stopping (`patience` > 0) stops a run after `patience` evaluations
without an improvement of at least `min_delta` over the value that last
reset the count. Both are computed from the history file, so a killed and
resumed run keeps counting where it was: evaluations after the checkpoint
it resumes from are dropped (that future is trained again).
"""

import json
import math
import os
from typing import Optional

import tensorflow as tf
from absl import logging

from tf_transformer.training import checkpoints

BEST_DIR = "best"
BEST_FILE = "best.json"
HISTORY_FILE = "evaluations.json"
# metric -> (the key of the evaluation's metrics, higher is better)
METRICS = {"bleu": ("bleu", True), "exact_match": ("exact_match", True),
           "loss": ("loss", False)}
METRIC_NAMES = {"bleu": "BLEU", "exact_match": "exact match", "loss": "loss"}


def default_metric(dataset) -> str:
  """The dev metric that selects checkpoints on `dataset` (a DataSpec's):
  exact match on the generated `numbers` task, whose German numbers are one
  word each (no 4-grams: BLEU is about 0 whatever the output), BLEU on
  translation corpora."""
  return "exact_match" if dataset == "numbers" else "bleu"


def rank(metrics, metric) -> tuple:
  """A key that orders dev scores (an evaluation's, or a candidate model's)
  from worst to best by `metric`, equal values by the lower dev loss
  (`metrics["loss"]`; none ranks last)."""
  key, higher_is_better = METRICS[metric]
  value = metrics[key]
  return (value if higher_is_better else -value,
          -metrics.get("loss", math.inf))


def best_checkpoint(model_dir) -> str:
  """The checkpoint path of MODEL_DIR/best/ (by its index, else by the
  name best.json gives); FileNotFoundError if none."""
  directory = os.path.join(model_dir, BEST_DIR)
  path = tf.train.latest_checkpoint(directory)
  kept = read_best(model_dir)
  # A run begun before 4d42639 may have indexed it wrongly.
  if not path and kept and kept.get("checkpoint"):
    path = os.path.join(directory, kept["checkpoint"])
    path = path if tf.io.gfile.exists(path + ".index") else None
  if not path:
    raise FileNotFoundError(
        f"{directory}: no best checkpoint (the run kept none: train with "
        "--eval_every_steps > 0 on a dev split)")
  return path


def read_best(model_dir) -> Optional[dict]:
  """best.json of MODEL_DIR/best/ (step, metric, value, dev scores)."""
  path = os.path.join(model_dir, BEST_DIR, BEST_FILE)
  if not tf.io.gfile.exists(path):
    return None
  with tf.io.gfile.GFile(path) as f:
    return json.load(f)


class DevRecord:
  """The run's dev evaluations: `add(step, metrics, checkpoint)` records
  one and keeps the best checkpoint; `stop_reason` says when to stop."""

  def __init__(self, model_dir, metric="bleu", patience=0, min_delta=0.0,
               run_files=(), is_chief=True, evaluation=None):
    """`evaluation`: how dev was scored (search, sentences), written into
    best.json so that another model can be scored alike."""
    if metric not in METRICS:
      raise ValueError(f"--best_metric={metric}: expected one of "
                       f"{', '.join(METRICS)}")
    self.model_dir, self.metric = model_dir, metric
    self.key, self.higher_is_better = METRICS[metric]
    self.patience, self.min_delta = patience, min_delta
    self.run_files, self.is_chief = run_files, is_chief
    self.evaluation = evaluation or {}
    self.history = []

  def resume(self, step):
    """Reads the history up to `step` (the restored checkpoint's)."""
    path = os.path.join(self.model_dir, HISTORY_FILE)
    if not tf.io.gfile.exists(path):
      return
    with tf.io.gfile.GFile(path) as f:
      history = json.load(f)
    self.history = [e for e in history if e["step"] <= step]
    if len(self.history) < len(history):
      logging.info("dropped %d dev evaluation(s) after step %d, the step "
                   "this run resumes from", len(history) - len(self.history),
                   step)

  def _value(self, entry):
    return entry["metrics"].get(self.key)

  def _better(self, value, than, margin=0.0):
    if than is None:
      return True
    if self.higher_is_better:
      return value > than + margin
    return value < than - margin

  @property
  def best(self) -> Optional[dict]:
    """The best evaluation by `rank` (of equals, the earliest)."""
    scored = [e for e in self.history if self._value(e) is not None]
    return max(scored, key=lambda e: rank(e["metrics"], self.metric),
               default=None)

  def evaluations_without_improvement(self):
    """(count, the entry that last reset it): evaluations since the last
    one that improved by at least `min_delta`."""
    reference, count = None, 0
    for entry in self.history:
      value = self._value(entry)
      if value is None:
        continue
      if reference is None or self._better(value, self._value(reference),
                                           self.min_delta):
        reference, count = entry, 0
      else:
        count += 1
    return count, reference

  def add(self, step, metrics, checkpoint):
    """Records the evaluation at `step` of `checkpoint` (its step's); if it
    is the best so far, copies the checkpoint into MODEL_DIR/best/.
    Returns whether it was."""
    if self.history and self.history[-1]["step"] == step:
      self.history.pop()  # evaluated again after a resume
    self.history.append({"step": step, "metrics": dict(metrics)})
    if not self.is_chief:
      return False
    _write_json(os.path.join(self.model_dir, HISTORY_FILE), self.history)
    is_best = self.best is self.history[-1] and self._value(
        self.history[-1]) is not None
    if is_best:
      self._keep(step, metrics, checkpoint)
    return is_best

  def _keep(self, step, metrics, checkpoint):
    directory = os.path.join(self.model_dir, BEST_DIR)
    tf.io.gfile.makedirs(directory)
    name = os.path.basename(checkpoint)
    for path in tf.io.gfile.glob(checkpoint + ".*"):
      target = os.path.join(directory, os.path.basename(path))
      tf.io.gfile.copy(path, target + ".tmp", overwrite=True)
      tf.io.gfile.rename(target + ".tmp", target, overwrite=True)
    for run_file in self.run_files:
      source = os.path.join(self.model_dir, run_file)
      if tf.io.gfile.exists(source):
        checkpoints.copy_run_file(source, os.path.join(directory, run_file))
    # The index names the new checkpoint only once its files are complete,
    # by its bare name: TensorFlow reads it relative to the directory
    # wherever the run is moved. (tf.compat.v1.train.update_checkpoint_state
    # wrote "../../../ckpt-N" for a relative MODEL_DIR, which no reader
    # found: the README's job trains in runs/NAME/run.)
    _write_text(os.path.join(directory, "checkpoint"),
                f'model_checkpoint_path: "{name}"\n'
                f'all_model_checkpoint_paths: "{name}"\n')
    _write_json(os.path.join(directory, BEST_FILE), {
        "checkpoint": name, "step": step, "metric": self.metric,
        "value": metrics[self.key], "dev": dict(metrics),
        "evaluation": self.evaluation})
    # Every earlier best goes, including those a run begun before kept
    # under an index that named them wrongly.
    for path in tf.io.gfile.glob(os.path.join(directory, "ckpt-*")):
      if not os.path.basename(path).startswith(name + "."):
        tf.io.gfile.remove(path)
    logging.info("best dev %s so far (%.4g at step %d): kept in %s",
                 self.metric, metrics[self.key], step, directory)

  def stop_reason(self) -> Optional[str]:
    """A line saying why to stop early, or None."""
    if not self.patience:
      return None
    count, reference = self.evaluations_without_improvement()
    if count < self.patience:
      return None
    return (f"early stopping: dev {self.metric} has not improved by "
            f"{self.min_delta:g} or more on {self._value(reference):.4g} "
            f"(step {reference['step']}) in the last {count} evaluations "
            f"(--early_stopping={self.patience})")


def _write_json(path, value):
  _write_text(path, json.dumps(value, indent=2))


def _write_text(path, text):
  with tf.io.gfile.GFile(path + ".tmp", "w") as f:
    f.write(text)
  tf.io.gfile.rename(path + ".tmp", path, overwrite=True)
