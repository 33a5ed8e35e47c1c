"""--xla_attention: under TensorFlow the training step runs the attention
core and its gradient as XLA programs, one per batch shape, each length's
batches filled to one shape; nothing of it is saved with the layers."""

import re

import numpy as np
import pytest

from tf_transformer.data import batching
from tf_transformer.data import epoch_batches
from tf_transformer.data import token_store
from tf_transformer.run.runner import Runner
import tensorflow as tf

from conftest import run_script
import rounding
from test_fine_tuning import OPTIONS, OTHER_DATA, _config
from test_training import _assert_same_step, _first_update_bound
from training_helpers import SPEC, copy_weights, distribute, global_batch
from training_helpers import make_trainer, vocabulary


def _batches(tmp_path, full_rows):
  stores = token_store.open_training(str(tmp_path), SPEC, vocabulary())
  return epoch_batches.training_batches(stores, 512, 32,
                                        full_rows=full_rows)


def test_full_rows_fill_a_lengths_last_batch_with_empty_rows(tmp_path):
  """With `full_rows` every batch of a length has its rows: the same pairs
  as without, then rows of PAD; the shapes are one a length bucket."""
  plain, full = _batches(tmp_path, False), _batches(tmp_path, True)
  assert len(full.batch_shapes()) == len({n for _, n in full.batch_shapes()})
  assert len(plain.batch_shapes()) > len(full.batch_shapes())
  assert len(full.batch_shapes()) <= len(batching.bucket_lengths(32))
  filled = 0
  for index in range(plain.per_pipeline):
    ours, theirs = full.batch(0, index), plain.batch(0, index)
    rows = len(theirs[0])
    assert {a.shape for a in ours} <= full.batch_shapes()
    for a, b in zip(ours, theirs):
      np.testing.assert_array_equal(a[:rows], b)
      assert not a[rows:].any()
    filled += len(ours[0]) > rows
  assert filled  # some last batch was short


@pytest.mark.numeric
def test_xla_attention_trains_the_same_step(tmp_path):
  """The compiled core, on a batch filled with empty rows (as a length's
  last batch is), gives the plain step's losses and update within float32
  rounding (test_training.py's bounds: the filled rows hold no token)."""
  plain = make_trainer(tmp_path / "plain", xla_attention=False)
  compiled = make_trainer(tmp_path / "xla", xla_attention=True)
  copy_weights(plain, compiled)
  before = plain.model.get_weights()
  batch = global_batch(rows=8)
  (source, target_in), target_out = batch
  empty = lambda t: tf.concat([t, tf.zeros([4, t.shape[1]], t.dtype)], 0)
  filled = ((empty(source), empty(target_in)), empty(target_out))
  step = lambda trainer, batch: trainer.steps.compiled(
      trainer.steps.train_step)(distribute(trainer.strategy, batch))
  got, want = step(compiled, filled), step(plain, batch)
  _assert_same_step(plain, before, got, want, batch)
  for a, b in zip(compiled.model.get_weights(), plain.model.get_weights()):
    rounding.assert_within(a, b, _first_update_bound(plain, a))


def test_a_run_keeps_no_trace_of_the_option(trained_numbers_run, tmp_path):
  config = _config("dropout_rate=0.0", steps=3)
  start = dict(init_from=str(trained_numbers_run), **OPTIONS)
  result = Runner(str(tmp_path / "xla")).train(config, OTHER_DATA,
                                               xla_attention=True, **start)
  assert len(result["losses"]) == 3 and np.all(np.isfinite(result["losses"]))
  assert "xla_attention" not in (tmp_path / "xla" / "config.json").read_text()


@pytest.mark.slow
def test_a_run_compiles_at_most_one_attention_program_a_length(tmp_path):
  """bin/train.py --xla_attention=on over two epochs of every length: XLA
  (its compilation log) compiles the core and its gradient at most once
  for each batch shape the run logs, at most one a length bucket."""
  result = run_script(
      "train.py", f"--model_dir={tmp_path}", "--dataset=numbers",
      "--numbers_train_size=300", "--config=tiny", "--hparams=num_layers=1",
      "--max_length=32", "--batch_tokens=512", "--eval_every_steps=0",
      "--checkpoint_every_secs=0", "--train_steps=60", "--xla_attention=on",
      "--noxla_loss", "--alsologtostderr",
      env={"TF_CPP_MIN_LOG_LEVEL": "0",
           "TF_CPP_VMODULE": "device_compilation_profiler=1"})
  assert result.returncode == 0, result.stderr[-3000:]
  shapes = int(re.search(r"one program for each of the (\d+) batch shapes",
                         result.stderr).group(1))
  assert 2 <= shapes <= len(batching.bucket_lengths(32))
  compiled = {}
  for name, times in re.findall(r"Compiled (\S*fused_attention\S*) "
                                r"(\d+) times", result.stderr):
    compiled[name] = max(compiled.get(name, 0), int(times))
  assert len(compiled) >= 2, result.stderr[-3000:]  # forward and gradient
  assert max(compiled.values()) <= shapes, compiled
