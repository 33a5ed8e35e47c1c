"""tf.data options for every input pipeline of the package: tf.data's
autotuning off, so that freeing an iterator does not wait on its tuning
thread.

With autotuning on (tf.data's default), each iterator starts a thread that
tunes the pipeline at growing intervals: 10 ms at first, doubling after
each pass up to 60 s, so about the iterator's age. Freeing the iterator
cancels that thread and waits for it to end. In TensorFlow 2.21 the
cancellation can fail to wake it: its callback notifies the thread
before the cancellation manager counts as cancelled, the thread checks,
finds it not yet cancelled and sleeps out its interval. The free, and the
Python thread that holds the GIL through it, then waits up to a minute
for nothing: at the end of training, after each dev pass, between a main
job's stages, at exit. docs/design.md ("The test suite's time, and where
it stalled") has the stack traces and the figures.

Our pipelines gain nothing from tuning: the training stream's work is one
vectorized batch gather a step, the dev pipeline's a map and a bucketing;
`num_parallel_calls=tf.data.AUTOTUNE` then runs at tf.data's default
parallelism (the cores, at most 16) and `prefetch(tf.data.AUTOTUNE)` still
sizes its buffer by itself (the prefetch autotuner needs no tuning
thread).

`tf.distribute` iterators read a pipeline through one more per device
(`MultiDeviceIterator`: a generator and a prefetch of fixed size, nothing
to tune) that tf.data builds with default options; `without_autotuning`
also gives those ours, through the one function that builds them.
"""

import functools

from absl import logging
import tensorflow as tf
from tensorflow.python.data.ops import multi_device_iterator_ops


def options() -> tf.data.Options:
  """tf.data options with autotuning off."""
  result = tf.data.Options()
  result.autotune.enabled = False
  return result


def without_autotuning(dataset: tf.data.Dataset) -> tf.data.Dataset:
  """`dataset` with `options()`, ready to iterate; also turns autotuning
  off in the per-device pipelines of `tf.distribute` iterators."""
  _per_device_pipelines_without_autotuning()
  return dataset.with_options(options())


@functools.cache
def _per_device_pipelines_without_autotuning() -> bool:
  """Wraps `multi_device_iterator_ops._create_device_dataset` (once) so
  that each per-device pipeline gets `options()`; False, with a warning,
  where this TensorFlow has no such function (then a freed distributed
  iterator may wait as the module's docstring says, and nothing else
  changes)."""
  if per_device_pipelines_without_autotuning():
    return True
  create = getattr(multi_device_iterator_ops, "_create_device_dataset", None)
  if create is None:
    logging.warning("tf.data's per-device pipelines keep autotuning: this "
                    "TensorFlow has no multi_device_iterator_ops."
                    "_create_device_dataset")
    return False

  @functools.wraps(create)
  def create_without_autotuning(*args, **kwargs):
    return create(*args, **kwargs).with_options(options())

  create_without_autotuning.without_autotuning = True
  multi_device_iterator_ops._create_device_dataset = create_without_autotuning  # pylint: disable=protected-access
  return True


def per_device_pipelines_without_autotuning() -> bool:
  """Whether `tf.distribute`'s per-device pipelines get `options()` in this
  process (after any `without_autotuning` call)."""
  create = getattr(multi_device_iterator_ops, "_create_device_dataset", None)
  return bool(getattr(create, "without_autotuning", False))
