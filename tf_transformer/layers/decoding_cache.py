"""The incremental-decoding cache, laid out so that a step reads only the
positions decoded so far and copies nothing.

Decoding runs `batch * group_size` rows: `group_size` hypotheses of each
sentence (the beams of a beam search; 1 for greedy decoding and sampling), row
r holding slot r % group_size of sentence r // group_size. Per decoder layer:

  key, value     [num_blocks, batch, heads, BLOCK_LENGTH * group_size, depth]:
                 position t of slot j, what the hypothesis in slot j at step t
                 computed, is row (t % BLOCK_LENGTH) * group_size + j of
                 block t // BLOCK_LENGTH;
  memory_key,    [batch, heads, source_length, depth]: the encoder output's
  memory_value   keys and values (section 3.2.3), once per sentence, shared
                 by its hypotheses;

and for the whole decoder

  ancestors      [batch, group_size, num_blocks * BLOCK_LENGTH] int32: for
                 each hypothesis, the slot each of its earlier positions
                 was computed in; -1 (no slot) at the positions not decoded
                 yet, so that they select no key.

Three choices keep a step's cost from growing with copies:
- Indirection: a beam search that moves hypotheses between slots gathers
  `ancestors` only (a few integers per row, `reorder`), never keys and
  values; attention takes each position's key and value from the slot of the
  row's ancestor there (as FasterTransformer's "cache indirection" does).
- In-place writes: each step writes its position with `InplaceUpdate` into a
  buffer from `Empty` (stateful, so Grappler never folds it into a constant
  shared between calls). `tf.tensor_scatter_nd_update` copied the whole
  buffer every step inside the decoding loop. The write is safe because the
  only readers of a layer's buffer at step t are that step's attention ops,
  and step t + 1's write depends on them through step t's logits. A step
  consumes the cache it is given: do not keep the old one.
- Blocks along time: the filled blocks are a leading-axis slice, which
  TensorFlow takes without a copy, so step t reads about t positions, not
  the preallocated maximum; one batched matmul per block keeps the matmuls
  large enough to be efficient.

XLA has neither `InplaceUpdate` nor dynamic shapes: inside an XLA cluster the
write is a scatter (XLA updates it in place) and attention reads every block
under a mask, so the step keeps static shapes and compiles once.
"""

import math
import typing

import tensorflow as tf

from tf_transformer.layers import masks
from tf_transformer.layers.shapes import dims

BLOCK_LENGTH = 16  # positions per block: 8 and 32 measured no faster

try:  # TensorFlow's own test for "inside an XLA cluster" (not public API).
  from tensorflow.python.ops.control_flow_util import (  # pylint: disable=g-direct-tensorflow-import
      GraphOrParentsInXlaContext as _graph_in_xla)
except ImportError:  # pragma: no cover - then always the XLA-safe ops
  _graph_in_xla = None


def in_xla():
  if _graph_in_xla is None:
    return True  # scatter writes and full reads are correct everywhere
  if tf.executing_eagerly():
    return False
  return _graph_in_xla(tf.compat.v1.get_default_graph())


def _zeros(shape, dtype):
  """Zeros that are never folded into a constant shared between calls."""
  if in_xla():
    return tf.zeros(shape, dtype)
  return tf.raw_ops.Empty(shape=tf.stack(shape), dtype=dtype, init=True)


def _num_blocks(max_length):
  return (max_length + BLOCK_LENGTH - 1) // BLOCK_LENGTH


def buffer(batch, heads, max_length, group_size, depth, dtype):
  """Zero keys or values for `max_length` positions (rounded up to whole
  blocks) of `group_size` slots per sentence."""
  return _zeros([_num_blocks(max_length), batch, heads,
                 BLOCK_LENGTH * group_size, depth], dtype)


def initial_ancestors(batch, group_size, max_length):
  """No slot (-1) at every position; never written in place."""
  return tf.fill([batch, group_size, _num_blocks(max_length) * BLOCK_LENGTH],
                 -1)


def group_size(layer_cache):
  """The hypotheses per sentence (slots) of a layer's cache."""
  return layer_cache["key"].shape[3] // BLOCK_LENGTH


def mark_step(ancestors, step):
  """Records that each hypothesis computes position `step` in its own
  slot."""
  return _mark(ancestors, step, dims(ancestors)[2])


def _mark(ancestors, step, length):
  here = tf.one_hot(step, length, True, False)
  # (expand_dims, not [tf.newaxis] slices: no kernel of its own)
  return tf.where(here, tf.expand_dims(tf.range(ancestors.shape[1]), 1),
                  ancestors)


def reorder(ancestors, parents):
  """After a beam search step: hypothesis (b, j) continues the one that was
  in slot `parents[b, j]` ([batch, group] int)."""
  return tf.gather(ancestors, parents, batch_dims=1)


def selection(ancestors, step, group_size):
  """Which cached key rows each query row attends to at `step`, as a mask of
  the scores `attend` gives `masks.masked_softmax`: bool [batch, 1,
  group (query), num_blocks * BLOCK_LENGTH * group (key rows)], True where
  the row holds the query's ancestor at that position (its slot) and the
  position is at most `step`. Computed once per step and shared by every
  layer; outside XLA only the blocks filled so far."""
  batch, _, length = dims(ancestors)
  num_blocks, slots = _filled_slots(ancestors, step, length)
  return tf.reshape(tf.one_hot(slots, group_size, True, False),
                    [batch, 1, group_size,
                     num_blocks * BLOCK_LENGTH * group_size])


def _filled_slots(ancestors, step, length):
  """(blocks read, slots [batch, group, blocks * BLOCK_LENGTH]): the slot
  of each hypothesis' ancestor at each position read, -1 (one_hot of no
  slot) after `step`; outside XLA only the blocks filled so far."""
  if in_xla():
    return length // BLOCK_LENGTH, ancestors
  num_blocks = step // BLOCK_LENGTH + 1
  # The slice's end as [0, 0, n * BLOCK_LENGTH] from one multiply (the
  # first two axes whole): `[:, :, :n]` packs its end in a kernel of its
  # own.
  end = tf.constant([0, 0, BLOCK_LENGTH]) * num_blocks
  return num_blocks, tf.strided_slice(ancestors, [0, 0, 0], end,
                                      end_mask=0b011)


def _rows_at_step(batch, heads, step):
  """The rows of a buffer's [num_blocks * batch * heads * BLOCK_LENGTH,
  group * depth] view that hold position `step`: one in every
  BLOCK_LENGTH of its block's."""
  block_rows = batch * (heads * BLOCK_LENGTH)
  first = step // BLOCK_LENGTH * block_rows + step % BLOCK_LENGTH
  return tf.range(first, first + block_rows, BLOCK_LENGTH)


def select(layer_cache, sentences):
  """One layer's cache for the sentences at positions `sentences` [n]."""
  return {name: tf.gather(value, sentences, axis=SENTENCE_AXES[name])
          for name, value in layer_cache.items()}


# The sentence axis of each entry of a layer's cache.
SENTENCE_AXES = {"key": 1, "value": 1, "memory_key": 0, "memory_value": 0}


def write(cache_buffer, new, step):
  """Writes `new`, the keys or values [batch, heads, group, depth] of
  position `step`, into `cache_buffer` (from `buffer`); returns the buffer."""
  num_blocks, batch, heads, rows, depth = dims(cache_buffer)
  group = rows // BLOCK_LENGTH
  values = tf.reshape(new, [batch, heads, group * depth])
  block, offset = step // BLOCK_LENGTH, step % BLOCK_LENGTH
  view = [num_blocks, batch, heads, BLOCK_LENGTH, group * depth]
  if in_xla():
    where = tf.stack(tf.meshgrid(tf.range(batch), tf.range(heads),
                                 indexing="ij"), axis=-1)
    where = tf.concat([tf.fill([batch, heads, 1], block), where,
                       tf.fill([batch, heads, 1], offset)], axis=-1)
    updated = tf.tensor_scatter_nd_update(tf.reshape(cache_buffer, view),
                                          where, values)
    return tf.reshape(updated, tf.shape(cache_buffer))
  flat = tf.reshape(cache_buffer, [-1, group * depth])
  flat = tf.raw_ops.InplaceUpdate(
      x=flat, i=_rows_at_step(batch, heads, step),
      v=tf.reshape(values, [batch * heads, -1]))
  return tf.reshape(flat, tf.shape(cache_buffer))


def attend(query, key, value, select, step):
  """Eq. 1 for one decoder position over the cached positions 0..step, each
  taken from the slot of the row's ancestor there.

  query: Q W^Q heads [batch, heads, group, d_k]; key, value: from `buffer`,
  position `step` written; select: `selection(...)` of this step. Returns
  (output [batch, heads, group, d_v], weights [batch, heads, group, n]) over
  the first n = whole blocks up to `step` positions (every block under XLA).

  Every query of a sentence meets every slot's keys, one batched matmul per
  block; the rows that are not the query's ancestor (or lie after `step`)
  get no weight in the softmax, so its weights are the values' coefficients
  as they stand, with nothing selected or spread.
  """
  num_blocks, batch, heads, rows, d_k = dims(key)
  group = rows // BLOCK_LENGTH
  if not in_xla():  # the filled blocks: a slice without a copy
    num_blocks = step // BLOCK_LENGTH + 1
    key, value = key[:num_blocks], value[:num_blocks]
  q = (query * tf.cast(1.0 / math.sqrt(d_k), query.dtype))[tf.newaxis]
  scores = tf.matmul(q, key, transpose_b=True)  # [blocks, b, h, group, rows]
  scores = tf.reshape(tf.transpose(scores, [1, 2, 3, 0, 4]),
                      [batch, heads, group, num_blocks * rows])
  weights = masks.masked_softmax(scores, select)
  spread = tf.transpose(tf.reshape(
      weights, [batch, heads, group, num_blocks, rows]), [3, 0, 1, 2, 4])
  output = tf.reduce_sum(tf.matmul(spread, value), axis=0)
  # One row per position has weight: the sum over slots is that weight.
  weights = tf.reduce_sum(tf.reshape(
      weights, [batch, heads, group, num_blocks * BLOCK_LENGTH, group]), -1)
  return output, weights


class StepPlan(typing.NamedTuple):
  """What every layer's cache reads and writes share at one step, computed
  once per step (`plan_step`) rather than once per layer and buffer."""
  num_blocks: typing.Any  # the blocks read: those filled so far (all under XLA)
  selection: tf.Tensor  # bool [num_blocks, batch, 1, group, BLOCK_LENGTH * group]
  rows: tf.Tensor  # rows of a buffer's flat view that position `step` fills
  # (None under XLA)
  step: tf.Tensor
  # The scores' shapes [batch, heads, group, blocks * rows] and [batch,
  # heads, group, blocks, rows] (the batch as -1): attention's softmax runs
  # over the positions of every block at once.
  positions_shape: typing.Any
  blocks_shape: typing.Any


def plan_step(ancestors, step, group_size, heads):
  """(`ancestors` marked at `step` as `mark_step` marks them, the
  `StepPlan` of position `step`): the selection of `selection`, laid out
  blocks first as `attend_blocks` reads the scores, and the rows
  `write_planned` writes in a buffer of `heads` heads. (Marking here reads
  the ancestors' sizes once a step.)"""
  batch, _, length = dims(ancestors)
  ancestors = _mark(ancestors, step, length)
  num_blocks, slots = _filled_slots(ancestors, step, length)
  select = tf.reshape(tf.one_hot(slots, group_size, True, False),
                      [batch, group_size, num_blocks,
                       BLOCK_LENGTH * group_size])
  select = tf.expand_dims(tf.transpose(select, [2, 0, 1, 3]), 2)
  # (Under XLA the write is a scatter, and a range must have static ends.)
  rows = None if in_xla() else _rows_at_step(batch, heads, step)
  block_rows = BLOCK_LENGTH * group_size
  if in_xla():
    positions_shape = [-1, heads, group_size, num_blocks * block_rows]
    blocks_shape = [-1, heads, group_size, num_blocks, block_rows]
  else:  # (two concats and a multiply, once a step)
    blocks = tf.reshape(num_blocks, [1])
    positions_shape = tf.concat([[-1, heads, group_size],
                                 blocks * block_rows], 0)
    blocks_shape = tf.concat([[-1, heads, group_size], blocks, [block_rows]],
                             0)
  return ancestors, StepPlan(num_blocks, select, rows, step, positions_shape,
                             blocks_shape)


def write_planned(cache_buffer, new, plan):
  """`write`, with the rows of `plan`: `new` [batch, heads, group, depth]
  goes to position `plan.step`."""
  if in_xla():
    return write(cache_buffer, new, plan.step)
  row_size = cache_buffer.shape[3] // BLOCK_LENGTH * cache_buffer.shape[4]
  flat = tf.raw_ops.InplaceUpdate(
      x=tf.reshape(cache_buffer, [-1, row_size]), i=plan.rows,
      v=tf.reshape(new, [-1, row_size]))
  return tf.reshape(flat, tf.shape(cache_buffer))


def attend_blocks(query, key, value, plan):
  """`attend`'s output for a query already scaled by 1 / sqrt(d_k), with
  the softmax taken over the blocks and their rows where they lie, so that
  neither the scores nor the weights are transposed (the fused step's
  attention; `attend` also returns the weights per position)."""
  if not in_xla():
    key, value = key[:plan.num_blocks], value[:plan.num_blocks]
  scores = tf.matmul(tf.expand_dims(query, 0), key, transpose_b=True)
  scores = tf.where(plan.selection, scores, scores.dtype.min)
  # One softmax over the blocks' positions: two transposes and a Softmax,
  # where the reductions over blocks and rows in place took five kernels.
  weights = tf.nn.softmax(tf.cast(tf.reshape(
      tf.transpose(scores, [1, 2, 3, 0, 4]), plan.positions_shape),
                                  tf.float32))
  weights = tf.transpose(tf.reshape(weights, plan.blocks_shape),
                         [3, 0, 1, 2, 4])
  return tf.reduce_sum(tf.matmul(tf.cast(weights, value.dtype), value), 0)
