"""Shape helpers of the decoding step and its cache (TensorFlow)."""

import tensorflow as tf


def dims(x):
  """x's sizes: static where known, else dynamic (explicit sizes, since -1
  is ambiguous for empty batches). The dynamic ones from one Unpack of the
  shape, not a slice kernel each (a decoding step runs this every step)."""
  static = x.shape.as_list()
  if None not in static:
    return static
  dynamic = tf.unstack(tf.shape(x), num=len(static))
  return [dynamic[i] if size is None else size
          for i, size in enumerate(static)]


def swap_axes_1_2(x):
  """Transpose of axes 1 and 2 of a rank-4 tensor; a reshape when one of
  them has size 1 (one query position, as in a greedy decoding step, or one
  head), which moves no data."""
  shape = dims(x)
  if x.shape[1] == 1 or x.shape[2] == 1:
    return tf.reshape(x, [shape[0], shape[2], shape[1], shape[3]])
  return tf.transpose(x, [0, 2, 1, 3])
