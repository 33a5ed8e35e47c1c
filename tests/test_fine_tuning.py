"""Fine-tuning (--init_from): a new run starts from another run's model
weights with a fresh optimizer, step and schedule; another architecture or
vocabulary is refused, and so is resuming a run on other training data."""

import json

import numpy as np
import pytest

from tf_transformer import get_config
from tf_transformer.data import prepare
from tf_transformer.data.sources import DataSpec
from tf_transformer.run import run_dir
from tf_transformer.run.runner import Runner
from conftest import run_script
from training_helpers import SPEC, UNCOMPILED, UNCOMPILED_FLAGS, vocabulary

# Slow (README.md's quick tier leaves it out): fine-tuning runs, end to end.
pytestmark = pytest.mark.slow

OPTIONS = dict(max_length=32, eval_every_steps=0, checkpoint_every_secs=0,
               log_every_steps=1, **UNCOMPILED)
OTHER_DATA = DataSpec(dataset="numbers", numbers_train_size=500, seed=3)


def _config(overrides="dropout_rate=0.0", steps=4):
  return get_config("tiny", overrides, vocab_size=vocabulary().vocab_size,
                    train_steps=steps, batch_tokens=512)


def test_starts_from_the_weights_with_a_fresh_optimizer(trained_numbers_run,
                                                        tmp_path):
  fresh = Runner(str(tmp_path / "fresh")).train(
      _config(), OTHER_DATA, vocab_size=400, **OPTIONS)
  tuned = Runner(str(tmp_path / "tuned")).train(
      _config(), OTHER_DATA, init_from=str(trained_numbers_run), **OPTIONS)
  # A fresh step count and schedule, the other run's weights: its first
  # losses are a trained model's, not a new one's.
  assert tuned["step"] == 4 and len(tuned["losses"]) == 4
  assert tuned["losses"][0] < 0.5 * fresh["losses"][0]
  assert (tmp_path / "tuned" / "vocabulary.model").read_bytes() == (
      (trained_numbers_run / "vocabulary.model").read_bytes())
  model, _ = run_dir.load_trained_model(str(tmp_path / "tuned"))
  theirs, _ = run_dir.load_trained_model(str(trained_numbers_run))
  assert not np.allclose(model.get_weights()[0], theirs.get_weights()[0])
  # Resumed, the run is its own: --init_from no longer applies.
  again = Runner(str(tmp_path / "tuned")).train(
      _config(steps=6), OTHER_DATA, init_from=str(trained_numbers_run),
      **OPTIONS)
  assert again["step"] == 6 and len(again["losses"]) == 2


def test_refuses_another_architecture_or_vocabulary(trained_numbers_run,
                                                    tmp_path):
  with pytest.raises(ValueError, match=r"has another architecture than "
                     r"asked \(theirs, asked\): \{'d_ff': \(256, 128\)\}"):
    Runner(str(tmp_path / "a")).train(
        _config("dropout_rate=0.0,d_ff=128"), OTHER_DATA,
        init_from=str(trained_numbers_run), **OPTIONS)
  (tmp_path / "b").mkdir()
  prepare.build_vocabulary(SPEC, 300).save(str(tmp_path / "b"))
  with pytest.raises(ValueError, match="holds another vocabulary than "
                     "--init_from="):
    Runner(str(tmp_path / "b")).train(
        _config(), OTHER_DATA, init_from=str(trained_numbers_run), **OPTIONS)
  with pytest.raises(FileNotFoundError, match="--init_from=.*: neither a "
                     "model directory"):
    Runner(str(tmp_path / "c")).train(_config(), OTHER_DATA,
                                      init_from=str(tmp_path), **OPTIONS)


def test_resuming_on_other_data_is_refused_unless_asked(tmp_path):
  runner = Runner(str(tmp_path))
  runner.train(_config(steps=2), SPEC, vocab_size=400, **OPTIONS)
  with pytest.raises(ValueError, match=r"was trained on other data \(saved, "
                     r"asked\): \{'numbers_train_size': \(300, 500\)\}.*"
                     "--init_from=.*--allow_data_change"):
    runner.train(_config(steps=4), OTHER_DATA, **OPTIONS)
  result = runner.train(_config(steps=4), OTHER_DATA, allow_data_change=True,
                        **OPTIONS)
  assert result["step"] == 4  # the optimizer's step went on
  spec = json.loads((tmp_path / "data_spec.json").read_text())
  assert spec["numbers_train_size"] == 500


def test_bin_train_takes_the_other_runs_config(trained_numbers_run,
                                               tmp_path):
  result = run_script("train.py", f"--model_dir={tmp_path}",
                      f"--init_from={trained_numbers_run}",
                      "--dataset=numbers", "--numbers_train_size=500",
                      "--train_steps=2", "--batch_tokens=512",
                      "--max_length=32", "--eval_every_steps=0",
                      "--checkpoint_every_secs=0", *UNCOMPILED_FLAGS)
  assert result.returncode == 0, result.stderr[-3000:]
  assert (f"initialized the model weights from {trained_numbers_run}/"
          "ckpt-400") in result.stderr
  assert run_dir.load_config(str(tmp_path)).model == (
      run_dir.load_config(str(trained_numbers_run)).model)


def test_the_starting_weights_are_evaluated_as_step_0(trained_numbers_run,
                                                      tmp_path):
  """So that the best checkpoint is the starting point where fine-tuning
  never beats it."""
  options = dict(OPTIONS, eval_every_steps=2, eval_max_sentences=8,
                 best_metric="loss")
  result = Runner(str(tmp_path)).train(
      _config(steps=2), OTHER_DATA, init_from=str(trained_numbers_run),
      **options)
  history = json.loads((tmp_path / "evaluations.json").read_text())
  assert [e["step"] for e in history] == [0, 2]
  losses = [e["metrics"]["loss"] for e in history]
  assert result["best"]["step"] == [0, 2][int(np.argmin(losses))]
  assert (tmp_path / "best" / "best.json").exists()


def test_a_shallower_student_starts_from_each_stacks_first_layers(
    trained_numbers_run, tmp_path):
  """A student asks fewer decoder layers than the run it starts from: its
  starting weights (saved as step 0) are the teacher's embeddings, encoder
  and first decoder layer, bit for bit; more layers than the teacher's are
  refused."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  options = dict(OPTIONS, eval_every_steps=2, eval_max_sentences=8,
                 best_metric="loss")
  Runner(str(tmp_path / "student")).train(
      _config("dropout_rate=0.0,num_decoder_layers=1", steps=2), OTHER_DATA,
      init_from=str(trained_numbers_run), **options)
  student, _ = run_dir.load_trained_model(
      str(tmp_path / "student"), str(tmp_path / "student" / "ckpt-0"))
  teacher, _ = run_dir.load_trained_model(str(trained_numbers_run))
  ours, theirs = student.named_weights(), teacher.named_weights()
  assert (len(ours.encoder.layers), len(ours.decoder.layers)) == (2, 1)
  pairs = [(ours.source_embedding, theirs.source_embedding),
           (ours.encoder.layers, theirs.encoder.layers),
           (ours.decoder.layers[0], theirs.decoder.layers[0])]
  flat = lambda tree: [np.asarray(v) for v in tf.nest.flatten(tree)
                       if hasattr(v, "shape")]
  for mine, other in pairs:
    assert all(np.array_equal(a, b) for a, b in zip(
        flat(mine), flat(other), strict=True))
  trained, _ = run_dir.load_trained_model(str(tmp_path / "student"))
  assert not np.array_equal(  # then trained on
      flat(trained.named_weights().decoder.layers[0])[0],
      flat(ours.decoder.layers[0])[0])
  with pytest.raises(ValueError, match=r"has another architecture than "
                     r"asked \(theirs, asked\): \{'num_encoder_layers': "
                     r"\(2, 3\)\}.*fewer encoder or decoder layers"):
    Runner(str(tmp_path / "deeper")).train(
        _config("dropout_rate=0.0,num_encoder_layers=3"), OTHER_DATA,
        init_from=str(trained_numbers_run), **OPTIONS)
