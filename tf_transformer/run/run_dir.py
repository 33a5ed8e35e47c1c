"""What a model directory holds, so later commands need only --model_dir:
config.json (the TransformerConfig), vocabulary.model (SentencePiece),
data_spec.json (where the data came from), data_stats.json (pairs, lengths,
pairs dropped and why), train_flags.txt (the command line) and the
checkpoints."""

import dataclasses
import json
import os
import time

import tensorflow as tf

from tf_transformer.config import TransformerConfig
from tf_transformer.data import vocabulary as vocabulary_lib
from tf_transformer.data.sources import DataSpec

CONFIG = "config.json"
DATA_SPEC = "data_spec.json"


def _write(path, text):
  tmp = path + ".tmp"
  with tf.io.gfile.GFile(tmp, "w") as f:
    f.write(text)
  tf.io.gfile.rename(tmp, path, overwrite=True)  # atomic: no half files


def save(model_dir, config: TransformerConfig, spec: DataSpec = None,
         flags_text: str = None, data_stats: dict = None):
  tf.io.gfile.makedirs(model_dir)
  _write(os.path.join(model_dir, CONFIG), config.to_json())
  if spec is not None:
    _write(os.path.join(model_dir, DATA_SPEC),
           json.dumps(dataclasses.asdict(spec), indent=2))
  if flags_text is not None:
    _write(os.path.join(model_dir, "train_flags.txt"), flags_text)
  if data_stats is not None:
    _write(os.path.join(model_dir, "data_stats.json"),
           json.dumps(data_stats, indent=2))


def load_config(model_dir) -> TransformerConfig:
  path = os.path.join(model_dir, CONFIG)
  if not tf.io.gfile.exists(path):
    raise FileNotFoundError(f"{path}: not a model directory (no {CONFIG}); "
                            "train one with bin/train.py")
  with tf.io.gfile.GFile(path) as f:
    return TransformerConfig.from_dict(json.load(f))


def load_spec(model_dir) -> DataSpec:
  path = os.path.join(model_dir, DATA_SPEC)
  with tf.io.gfile.GFile(path) as f:
    return DataSpec(**json.load(f))


def load(model_dir):
  """(config, vocabulary) of a trained model directory."""
  return load_config(model_dir), vocabulary_lib.Vocabulary.load(model_dir)


def load_trained_model(model_dir, checkpoint=None):
  """(model, vocabulary) with every model weight read from `checkpoint`
  (default: the newest in `model_dir`, e.g. an averaged directory; "best":
  the run's best by dev, `training/best.py`), built to decode: in float32
  whatever Keras' global policy (a run trained in mixed precision still
  keeps float32 weights; an export casts them by its own --dtype)."""
  from tf_transformer.model import build_model  # pylint: disable=g-import-not-at-top
  from tf_transformer.training import best  # pylint: disable=g-import-not-at-top
  config, vocabulary = load(model_dir)
  model = build_model(config, dtype="float32")
  if checkpoint == "best":
    checkpoint = best.best_checkpoint(model_dir)
  path = checkpoint or tf.train.latest_checkpoint(model_dir)
  if not path:
    raise FileNotFoundError(f"{model_dir}: no checkpoint")
  tf.train.Checkpoint(model=model).read(path).expect_partial(
      ).assert_existing_objects_matched()
  return model, vocabulary


def run_and_checkpoint(path, flag="--init_from"):
  """(model directory, checkpoint) of `path`: a model directory (its newest
  checkpoint; RUN/best is one) or a checkpoint path (its directory must
  hold the run's config and vocabulary). Raises FileNotFoundError naming
  `flag`."""
  if tf.io.gfile.exists(os.path.join(path, CONFIG)):
    checkpoint = tf.train.latest_checkpoint(path)
    if not checkpoint:
      raise FileNotFoundError(f"{flag}={path}: a model directory without a "
                              "checkpoint")
    return path, checkpoint
  if tf.io.gfile.exists(path + ".index"):
    directory = os.path.dirname(path) or "."
    if not tf.io.gfile.exists(os.path.join(directory, CONFIG)):
      raise FileNotFoundError(f"{flag}={path}: its directory has no "
                              f"{CONFIG}")
    return directory, path
  raise FileNotFoundError(f"{flag}={path}: neither a model directory "
                          f"({CONFIG}) nor a checkpoint (PATH.index)")


def wait_for(model_dir, names=(CONFIG, vocabulary_lib.FILENAME),
             timeout_secs=3600):
  """Non-chief workers wait for the chief to write the run files."""
  deadline = time.time() + timeout_secs
  while not all(tf.io.gfile.exists(os.path.join(model_dir, n)) for n in names):
    if time.time() > deadline:
      raise TimeoutError(f"{model_dir}: the chief did not write {names}")
    time.sleep(1)
