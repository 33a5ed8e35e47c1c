"""Small runs for the training tests: a tiny config on a small numbers task."""

import functools

import keras
import numpy as np
import tensorflow as tf

from tf_transformer import get_config
from tf_transformer.data import pipeline_options
from tf_transformer.data import prepare
from tf_transformer.data.sources import DataSpec
from tf_transformer.special_ids import BOS_ID, EOS_ID
from tf_transformer.training import trainer as trainer_lib

SPEC = DataSpec(dataset="numbers", numbers_train_size=300)

# Training's mechanics (steps, distribution, checkpoints, resuming, stops,
# fine-tuning) are tested on one layer a side with the loss uncompiled: none
# of them depends on depth, and XLA compiles it anew for every batch shape
# of a short run. Depth is the model's tests'; XLA's loss equals the plain
# one in test_loss; the end-to-end runs (the main job, bin/train.py's
# TensorBoard test) keep the defaults (`tiny`'s two layers, XLA on), as
# `PRODUCT_DEFAULTS` asks of `make_trainer`. The shared trained fixture keeps
# the two layers and turns XLA off.
# bin/train.py takes the same as `MECHANICS_FLAGS`; a test that gives
# --hparams of its own gives ONE_LAYER in it.
ONE_LAYER = "num_layers=1"
MECHANICS = f"dropout_rate=0.0,{ONE_LAYER}"
UNCOMPILED = {"xla_loss": False}
PRODUCT_DEFAULTS = {option: True for option in UNCOMPILED}
UNCOMPILED_FLAGS = [f"--no{option}" for option in UNCOMPILED]
MECHANICS_FLAGS = [f"--hparams={ONE_LAYER}", *UNCOMPILED_FLAGS]


@functools.lru_cache(maxsize=1)
def vocabulary():
  return prepare.build_vocabulary(SPEC, 400)


def make_trainer(model_dir, strategy=None, overrides=MECHANICS,
                 train_steps=10, batch_tokens=512, **options):
  """A `Trainer` of `tiny` with `overrides` on the numbers task, on one CPU
  device unless `strategy`; `options`: `TrainOptions` fields over these
  tests' (no evaluation, a log line a step, `UNCOMPILED`)."""
  config = get_config("tiny", overrides, vocab_size=vocabulary().vocab_size,
                      train_steps=train_steps, batch_tokens=batch_tokens)
  options = trainer_lib.TrainOptions(
      model_dir=str(model_dir), **{"max_length": 32, "eval_every_steps": 0,
                                   "log_every_steps": 1,
                                   "checkpoint_every_secs": 0, **UNCOMPILED,
                                   **options})
  return trainer_lib.Trainer(config, vocabulary(), SPEC, options,
                             strategy or tf.distribute.OneDeviceStrategy(
                                 "/cpu:0"))


def global_batch(rows=8, length=8, seed=0, vocab=300):
  """((source, target_in), target_out) with uneven lengths and padding."""
  rng = np.random.default_rng(seed)
  source = rng.integers(4, vocab, size=(rows, length)).astype(np.int32)
  target = rng.integers(4, vocab, size=(rows, length)).astype(np.int32)
  for row in range(rows):
    source[row, rng.integers(2, length):] = 0
    target[row, rng.integers(2, length):] = 0
  target_in = np.concatenate([np.full((rows, 1), BOS_ID), target[:, :-1]], 1)
  target_out = np.where(target > 0, target, 0).astype(np.int32)
  target_out[np.arange(rows), (target > 0).sum(1) - 1] = EOS_ID
  return (tf.constant(source), tf.constant(target_in.astype(np.int32))), \
      tf.constant(target_out)


def distribute(strategy, batch):
  """The global batch split evenly over the strategy's replicas."""
  return next(iter(strategy.experimental_distribute_dataset(
      pipeline_options.without_autotuning(
          tf.data.Dataset.from_tensors(batch)))))


def copy_weights(source, target):
  target.model.set_weights(source.model.get_weights())


def write_run_dir(directory):
  """A run directory (config, vocabulary, one checkpoint) of an untrained
  tiny model: enough for export and translation mechanics."""
  from tf_transformer import build_model  # pylint: disable=g-import-not-at-top
  from tf_transformer.run import run_dir  # pylint: disable=g-import-not-at-top
  # Module fixtures call this before the per-test seeding: seed here, or
  # every run draws another model.
  keras.utils.set_random_seed(2024)
  config = get_config("tiny", vocab_size=vocabulary().vocab_size)
  model = build_model(config)
  run_dir.save(str(directory), config)
  vocabulary().save(str(directory))
  tf.train.CheckpointManager(tf.train.Checkpoint(model=model), str(directory),
                             max_to_keep=1).save(checkpoint_number=1)
  return directory


def write_run_and_export(directory, max_length_offset):
  """(run directory, its export's version folder), under `directory`, of an
  untrained tiny model, exported by bin/export.py as a user would."""
  from conftest import run_script  # pylint: disable=g-import-not-at-top
  model_dir = write_run_dir(directory / "run")
  export_dir = directory / "saved" / "numbers"
  result = run_script("export.py", f"--model_dir={model_dir}",
                      f"--export_dir={export_dir}",
                      f"--max_length_offset={max_length_offset}")
  assert result.returncode == 0, result.stderr[-2000:]
  assert f"exported {export_dir}/1" in result.stdout
  return model_dir, export_dir / "1"


def copy_task(examples=256, length=6, vocab=20, seed=0):
  """((source, target input), target output) batches of a task whose target
  is its source, for `model.fit`."""
  rng = np.random.default_rng(seed)
  source = rng.integers(4, vocab, size=(examples, length)).astype(np.int32)
  target_in = np.concatenate([np.full((examples, 1), BOS_ID), source], 1)
  target_out = np.concatenate([source, np.full((examples, 1), EOS_ID)], 1)
  return pipeline_options.without_autotuning(
      tf.data.Dataset.from_tensor_slices(
          ((source, target_in.astype(np.int32)),
           target_out.astype(np.int32))).batch(32))


def beam_search(model, sources, beam_size=4, alpha=0.6, max_length_offset=50,
                step_weights=None):
  """(ids, scores) of beam search over `sources` through the one entry,
  `search.decode`."""
  from tf_transformer.decoding.search import DecodingOptions, decode  # pylint: disable=g-import-not-at-top
  return decode(model, sources, DecodingOptions(
      beam_size=beam_size, length_penalty_alpha=alpha,
      max_decode_length_offset=max_length_offset), step_weights=step_weights)


def token_log_probs(model, processor, sources, targets):
  """log P(y_t | y_<t, X) of each target piece and EOS, teacher forced
  through the Keras model: one array per sentence."""
  encode = lambda texts: [ids + [EOS_ID] for ids in processor.encode(texts)]
  source = tf.ragged.constant(encode(list(sources))).to_tensor()
  target = encode(list(targets))
  target_out = tf.ragged.constant(target).to_tensor()
  target_in = tf.ragged.constant([[BOS_ID] + t[:-1] for t in target]
                                 ).to_tensor()
  log_probs = tf.nn.log_softmax(model((source, target_in)))
  picked = tf.gather(log_probs, target_out, batch_dims=2).numpy()
  return [row[:len(t)] for row, t in zip(picked, target)]
