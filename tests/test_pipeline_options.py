"""Every input pipeline the package iterates runs without tf.data's
autotuning, the per-device pipelines of tf.distribute iterators included
(tf_transformer/data/pipeline_options.py says why)."""

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.data.ops import iterator_ops
from tensorflow.python.data.ops import multi_device_iterator_ops

from tf_transformer.data import batching
from tf_transformer.data import epoch_batches
from tf_transformer.data import pipeline_options


@pytest.fixture
def iterated_options(monkeypatch):
  """The `autotune.enabled` option of each dataset an iterator is made
  for (`iter()`, for loops and tf.distribute's per-device iterators)."""
  seen = []
  create = iterator_ops.OwnedIterator._create_iterator

  def recording(self, dataset):
    seen.append(dataset.options().autotune.enabled)
    return create(self, dataset)

  monkeypatch.setattr(iterator_ops.OwnedIterator, "_create_iterator",
                      recording)
  return seen


def _token_pairs(rows=40, seed=0):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, 12, size=(rows, 2))
  return tf.data.Dataset.from_generator(
      lambda: ((rng.integers(4, 50, s).astype(np.int32),
                rng.integers(4, 50, t).astype(np.int32))
               for s, t in lengths),
      output_signature=(tf.TensorSpec([None], tf.int32),
                        tf.TensorSpec([None], tf.int32)))


def test_without_autotuning_turns_it_off_and_keeps_the_elements():
  dataset = tf.data.Dataset.range(10).map(
      lambda x: x * 2, num_parallel_calls=tf.data.AUTOTUNE).prefetch(
          tf.data.AUTOTUNE)
  assert dataset.options().autotune.enabled is None  # tf.data's default: on
  quiet = pipeline_options.without_autotuning(dataset)
  assert quiet.options().autotune.enabled is False
  assert list(quiet.as_numpy_iterator()) == list(range(0, 20, 2))


def test_the_dev_and_training_pipelines_have_no_autotuning():
  dev = batching.token_batches(_token_pairs(), batch_tokens=64, max_length=16)
  assert dev.options().autotune.enabled is False
  assert sum(1 for _ in dev) > 0
  stream = epoch_batches._stream(  # pylint: disable=protected-access
      _FixedBatches(), start_epoch=0, start_batch=1)
  assert stream.options().autotune.enabled is False
  (((source, target_in), target_out), (epoch, index)) = next(iter(stream))
  assert source.shape == (2, 3) and (int(epoch), int(index)) == (0, 1)


class _FixedBatches:
  """The interface `_stream` reads: `per_pipeline` and `batch()`."""
  per_pipeline = 4

  def batch(self, epoch, index):
    del epoch, index
    block = np.ones([2, 3], np.int32)
    return block, block, block


@pytest.mark.parametrize("devices", [1, 2])
def test_distributed_iterators_make_every_pipeline_without_autotuning(
    devices, iterated_options):
  strategy = tf.distribute.MirroredStrategy(
      [f"/cpu:{i}" for i in range(devices)])
  dataset_fn = batching.distributed_dataset_fn(
      _token_pairs, batch_tokens=64 * devices, max_length=16)
  batches = sum(1 for _ in strategy.distribute_datasets_from_function(
      dataset_fn))
  assert batches > 0
  # One per-device pipeline per device, which tf.distribute builds itself.
  assert len(iterated_options) >= devices
  assert iterated_options == [False] * len(iterated_options)
  assert pipeline_options.per_device_pipelines_without_autotuning()


def test_a_tensorflow_without_the_per_device_function_warns_and_goes_on(
    monkeypatch, caplog):
  monkeypatch.delattr(multi_device_iterator_ops, "_create_device_dataset")
  install = pipeline_options._per_device_pipelines_without_autotuning  # pylint: disable=protected-access
  install.cache_clear()
  try:
    dataset = pipeline_options.without_autotuning(tf.data.Dataset.range(3))
    assert dataset.options().autotune.enabled is False
    assert not pipeline_options.per_device_pipelines_without_autotuning()
    assert "_create_device_dataset" in caplog.text
  finally:
    install.cache_clear()
