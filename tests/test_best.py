"""The best checkpoint by dev and early stopping (training/best.py): kept
apart from the rolling checkpoints, exported by --checkpoint=best, counted
across a resume."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.run import run_dir
from tf_transformer.training import best as best_lib
from tf_transformer.training.best import DevRecord
from conftest import run_script
from training_helpers import make_trainer, vocabulary


def _checkpoint(directory, step):
  """A checkpoint ckpt-STEP of one variable holding `step`."""
  checkpoint = tf.train.Checkpoint(v=tf.Variable(float(step)))
  return checkpoint.write(os.path.join(directory, f"ckpt-{step}"))


def _record(tmp_path, bleus, **kwargs):
  record = DevRecord(str(tmp_path), **kwargs)
  for step, bleu in bleus:
    record.add(step, {"bleu": bleu, "loss": 10.0 - bleu},
               _checkpoint(str(tmp_path), step))
  return record


def _kept_step(tmp_path):
  path = best_lib.best_checkpoint(str(tmp_path))
  return float(tf.train.load_checkpoint(path).get_tensor(
      "v/.ATTRIBUTES/VARIABLE_VALUE"))


def test_keeps_the_best_checkpoint_apart(tmp_path):
  (tmp_path / "config.json").write_text("{}")
  record = _record(tmp_path, [(10, 20.0), (20, 25.0), (30, 24.0)],
                   run_files=("config.json",))
  assert record.best["step"] == 20
  assert _kept_step(tmp_path) == 20
  kept = json.loads((tmp_path / "best" / "best.json").read_text())
  assert kept["step"] == 20 and kept["value"] == 25.0
  assert kept["checkpoint"] == "ckpt-20"
  assert (tmp_path / "best" / "config.json").exists()
  # The previous best's files are gone, the rolling ones untouched.
  assert sorted(p for p in os.listdir(tmp_path / "best")
                if p.startswith("ckpt")) == [
                    "ckpt-20.data-00000-of-00001", "ckpt-20.index"]
  history = json.loads((tmp_path / "evaluations.json").read_text())
  assert [e["step"] for e in history] == [10, 20, 30]


def test_a_relative_model_dir_keeps_a_best_checkpoint_that_loads(
    tmp_path, monkeypatch):
  """The README's job trains in runs/NAME/run: relative to the working
  directory. A run begun before the fix left an index naming
  "../../../ckpt-N" and every earlier best's files: best.json's name finds
  its checkpoint, and the next best mends both."""
  monkeypatch.chdir(tmp_path)
  run = tmp_path / "runs" / "run"
  (run / "best").mkdir(parents=True)
  _checkpoint(str(run / "best"), 5)
  (run / "best" / "checkpoint").write_text(
      'model_checkpoint_path: "../../../ckpt-5"\n')
  (run / "best" / "best.json").write_text('{"checkpoint": "ckpt-5"}')
  relative = os.path.join("runs", "run")
  # Before the next best, the checkpoint best.json names is found.
  assert _kept_step(relative) == 5
  record = _record(relative, [(10, 20.0), (20, 25.0), (30, 24.0)])
  assert record.best["step"] == 20
  assert best_lib.best_checkpoint(relative) == os.path.join(
      relative, "best", "ckpt-20")
  assert _kept_step(relative) == 20
  state = tf.train.get_checkpoint_state(os.path.join(relative, "best"))
  assert state.model_checkpoint_path.endswith(os.path.join("best", "ckpt-20"))
  assert sorted(p for p in os.listdir(run / "best")
                if p.startswith("ckpt")) == [
                    "ckpt-20.data-00000-of-00001", "ckpt-20.index"]
  # The same directory, moved and read by its absolute path.
  os.rename(run, tmp_path / "moved")
  assert _kept_step(tmp_path / "moved") == 20


def test_loss_keeps_the_lowest(tmp_path):
  record = _record(tmp_path, [(10, 20.0), (20, 25.0), (30, 24.0)],
                   metric="loss")
  assert record.best["step"] == 20  # loss = 10 - bleu: lowest at step 20
  record.add(40, {"bleu": 0.0, "loss": -20.0}, _checkpoint(str(tmp_path), 40))
  assert _kept_step(tmp_path) == 40


def _scored(tmp_path, metric, evaluations):
  """A DevRecord of `metric` fed (step, bleu, exact match, loss) rows."""
  record = DevRecord(str(tmp_path), metric=metric)
  for step, bleu, exact_match, loss in evaluations:
    record.add(step, {"bleu": bleu, "exact_match": exact_match,
                      "loss": loss}, _checkpoint(str(tmp_path), step))
  return record


# The README's numbers job on one host: BLEU put step 666 first, where a
# later checkpoint translated 99.6% of dev exactly (German numbers are one
# word: BLEU is about 0 whatever the output).
NUMBERS_EVALUATIONS = [(666, 0.21, 0.818, 2.1), (1000, 0.0, 0.996, 1.9)]


def test_exact_match_keeps_what_bleu_would_not(tmp_path):
  record = _scored(tmp_path / "exact", "exact_match", NUMBERS_EVALUATIONS)
  assert record.best["step"] == 1000
  assert _kept_step(tmp_path / "exact") == 1000
  kept = best_lib.read_best(str(tmp_path / "exact"))
  assert kept["metric"] == "exact_match" and kept["value"] == 0.996
  # The same evaluations by BLEU: the two metrics disagree.
  assert _scored(tmp_path / "bleu", "bleu",
                 NUMBERS_EVALUATIONS).best["step"] == 666


def test_equal_values_go_to_the_lower_dev_loss(tmp_path):
  record = _scored(tmp_path, "bleu", [(10, 0.0, 0.0, 3.0), (20, 0.0, 0.0, 2.5),
                                      (30, 0.0, 0.0, 2.7)])
  assert record.best["step"] == 20
  assert _kept_step(tmp_path) == 20
  # Equal in both: the earlier stays.
  record.add(40, {"bleu": 0.0, "exact_match": 0.0, "loss": 2.5},
             _checkpoint(str(tmp_path), 40))
  assert _kept_step(tmp_path) == 20


def test_each_dataset_names_the_metric_that_selects():
  assert best_lib.default_metric("numbers") == "exact_match"
  assert best_lib.default_metric("") == "bleu"  # local files
  assert best_lib.default_metric("wmt14_translate/de-en") == "bleu"


def test_early_stopping_counts_from_the_last_real_improvement(tmp_path):
  # +0.3 is an improvement (a new best) but below min_delta=0.5: the count
  # goes on from 25.0.
  record = _record(tmp_path, [(10, 25.0), (20, 25.3), (30, 24.0)],
                   patience=3, min_delta=0.5)
  assert record.best["step"] == 20
  assert record.evaluations_without_improvement()[0] == 2
  assert record.stop_reason() is None
  record.add(40, {"bleu": 25.4, "loss": 1.0}, _checkpoint(str(tmp_path), 40))
  assert record.stop_reason() == (
      "early stopping: dev bleu has not improved by 0.5 or more on 25 "
      "(step 10) in the last 3 evaluations (--early_stopping=3)")
  record.add(50, {"bleu": 26.0, "loss": 1.0}, _checkpoint(str(tmp_path), 50))
  assert record.stop_reason() is None


def test_a_resume_drops_the_evaluations_it_trains_again(tmp_path):
  _record(tmp_path, [(10, 25.0), (20, 24.0), (30, 23.0)], patience=5)
  resumed = DevRecord(str(tmp_path), patience=2)
  resumed.resume(20)
  assert [e["step"] for e in resumed.history] == [10, 20]
  assert resumed.evaluations_without_improvement()[0] == 1
  resumed.add(30, {"bleu": 22.0}, _checkpoint(str(tmp_path), 30))
  assert resumed.stop_reason().startswith("early stopping")


def test_best_checkpoint_names_what_is_missing(tmp_path):
  with pytest.raises(FileNotFoundError, match="no best checkpoint"):
    best_lib.best_checkpoint(str(tmp_path))
  with pytest.raises(ValueError, match="--best_metric=chrf"):
    DevRecord(str(tmp_path), metric="chrf")


# Dev scores by step, scripted so that what is kept does not rest on how
# fast the tiny model learns on this host: step 4 ties step 2 on exact match
# with a higher loss, and every later evaluation is worse.
SCRIPTED_DEV = {2: (0.5, 2.0), 4: (0.5, 2.5), 6: (0.4, 1.0), 8: (0.3, 0.5)}


def _train(model_dir, train_steps, patience):
  """Trains for real, with dev scored by SCRIPTED_DEV; the numbers task
  selects by exact match (`best.default_metric`)."""
  trainer = make_trainer(model_dir, train_steps=train_steps,
                         eval_every_steps=2, eval_max_sentences=8,
                         keep_checkpoints=1, early_stopping=patience)
  trainer.evaluator = lambda step: {
      "bleu": 0.0, "exact_match": SCRIPTED_DEV[step][0],
      "loss": SCRIPTED_DEV[step][1]}
  run_dir.save(str(model_dir), trainer.config)
  vocabulary().save(str(model_dir))
  return trainer.train()


@pytest.mark.slow
def test_training_keeps_the_best_and_stops_early_across_a_resume(tmp_path):
  first = _train(tmp_path, 20, patience=2)
  assert first["step"] == 6 and first["stopped_early"].startswith(
      "early stopping: dev exact_match has not improved by 0 or more on "
      "0.5 (step 2) in the last 2 evaluations")
  assert first["best"]["step"] == 2
  # --keep_checkpoints=1 deleted ckpt-2 from the run; best/ still has it.
  assert [os.path.basename(p) for p in tf.io.gfile.glob(
      str(tmp_path / "ckpt-*.index"))] == ["ckpt-6.index"]
  best_path = best_lib.best_checkpoint(str(tmp_path))
  assert tf.train.load_checkpoint(best_path).get_tensor(
      "optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE") == 2
  assert best_lib.read_best(str(tmp_path))["metric"] == "exact_match"
  # Resumed with more patience, it counts on from 2 evaluations: one more.
  again = _train(tmp_path, 20, patience=3)
  assert again["step"] == 8 and "in the last 3 evaluations" in (
      again["stopped_early"])
  # The same command once more: nothing to train.
  assert _train(tmp_path, 20, patience=3)["losses"] == []

  # --checkpoint=best exports the kept weights, not the newest.
  best_model, _ = run_dir.load_trained_model(str(tmp_path), "best")
  newest, _ = run_dir.load_trained_model(str(tmp_path))
  assert not np.allclose(best_model.get_weights()[0],
                         newest.get_weights()[0])
  result = run_script("export.py", f"--model_dir={tmp_path}",
                      "--checkpoint=best",
                      f"--export_dir={tmp_path / 'export'}",
                      "--max_length_offset=4")
  assert result.returncode == 0, result.stderr[-2000:]
  assert f"restored the weights of {best_path} " in result.stderr
