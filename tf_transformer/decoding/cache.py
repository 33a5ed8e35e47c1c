"""The incremental-decoding cache, laid out so that a step reads only the
positions decoded so far and copies nothing (but the blocks filled so far,
once a block).

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
- In-place writes: each step writes its position with `InplaceUpdate` into
  the buffer it was given. `tf.tensor_scatter_nd_update` copied the whole
  buffer every step inside the decoding loop. The write is safe because the
  only readers of a layer's buffer at step t are that step's attention ops,
  and step t + 1's write depends on them through step t's logits. A step
  consumes the cache it is given: do not keep the old one.
- Blocks along time, added as they are needed: a buffer holds the blocks
  filled so far and no more. The step that starts a block appends it, zeros
  (`tf.pad`, which at every other step pads nothing and hands the buffer on
  uncopied), so step t reads about t positions, not the preallocated
  maximum, and a search that drops finished sentences (`select`) copies
  only what they decoded; one batched matmul per block keeps the matmuls
  large enough to be efficient.

With `static=True` (a search compiled by XLA, which has neither
`InplaceUpdate` nor dynamic shapes) the buffers hold every block from the
start, the write is a scatter (XLA updates it in place) and attention reads
every block under a mask: every shape is static, and the step compiles
once. Those ops are correct anywhere, only slower.
"""

import typing

import tensorflow as tf

from tf_transformer.decoding.shapes import dims

BLOCK_LENGTH = 16  # positions per block (docs/performance.md)
# The sentence axis of each entry of a layer's cache.
SENTENCE_AXES = {"key": 1, "value": 1, "memory_key": 0, "memory_value": 0}


def _num_blocks(max_length):
  return (max_length + BLOCK_LENGTH - 1) // BLOCK_LENGTH


def buffer(batch, heads, max_length, group_size, depth, dtype, static):
  """Keys or values of one attention before the first step.

  Args:
    batch, heads: the sentences and attention heads.
    max_length: the positions to hold (rounded up to whole blocks).
    group_size: slots (hypotheses) per sentence.
    depth: d_k or d_v.
    dtype: the compute dtype.
    static: every block, zeros, for XLA; else none yet (`write` appends
      each as its first position is written).
  Returns:
    [blocks, batch, heads, BLOCK_LENGTH * group_size, depth], blocks =
    max_length / BLOCK_LENGTH rounded up if `static`, else 0.
  """
  blocks = _num_blocks(max_length) if static else 0
  return tf.zeros([blocks, batch, heads, BLOCK_LENGTH * group_size, depth],
                  dtype)


def initial_ancestors(batch, group_size, max_length):
  """The ancestor table before any step: no slot (-1) at every position.

  Args:
    batch, group_size, max_length: as `buffer`'s.
  Returns:
    int32 [batch, group_size, blocks * BLOCK_LENGTH]; never written in
    place.
  """
  return tf.fill([batch, group_size, _num_blocks(max_length) * BLOCK_LENGTH],
                 -1)


def loop_shapes(cache):
  """The shapes of a cache (a `step.initial_cache`, or an ensemble's
  tuple of them) that a loop carrying it keeps: every buffer's block axis
  free, since the buffers grow (the module docstring)."""
  if isinstance(cache, tuple):  # an ensemble's members
    return tuple(loop_shapes(member) for member in cache)
  free = lambda x: tf.TensorShape([None]).concatenate(x.shape[1:])
  return {name: value.shape if name == "ancestors" else
          {key: free(part) if key in ("key", "value") else part.shape
           for key, part in value.items()}
          for name, value in cache.items()}


def group_size(layer_cache):
  """The hypotheses per sentence (slots) of a layer's cache."""
  return layer_cache["key"].shape[3] // BLOCK_LENGTH


def reorder(cache, parents):
  """Beam search's reordering: moves no key or value, only the ancestors.

  Args:
    cache: a decoder cache (`step.initial_cache`).
    parents: [batch, group] int, the slot each new hypothesis (b, j)
      continues.
  Returns:
    The cache with its ancestor table gathered by `parents`.
  """
  return dict(cache, ancestors=tf.gather(cache["ancestors"], parents,
                                         batch_dims=1))


def select(cache, sentences):
  """The cache of some sentences only (a search drops the ones it is done
  with); copies their keys and values.

  Args:
    cache: a decoder cache.
    sentences: [n] int, positions in the batch.
  Returns:
    The cache of those sentences, in that order.
  """
  return {name: tf.gather(value, sentences) if name == "ancestors" else
          {key: tf.gather(part, sentences, axis=SENTENCE_AXES[key])
           for key, part in value.items()}
          for name, value in cache.items()}


def sentence_axes(cache):
  """The cache's structure with each entry's sentence axis."""
  return {name: 0 if name == "ancestors" else dict(SENTENCE_AXES)
          for name in cache}


class StepPlan(typing.NamedTuple):
  """What every layer's cache reads and writes share at one step, computed
  once per step (`plan_step`) rather than once per layer and buffer."""
  static: bool  # XLA-safe ops and every block (module docstring)
  num_blocks: typing.Any  # the blocks read: those filled so far, or all
  selection: tf.Tensor  # bool [num_blocks, batch, 1, group, BLOCK_LENGTH * group]
  rows: tf.Tensor  # rows of a buffer's flat view that position `step` fills
  # (None when static)
  # The blocks a buffer grows by at this step, as `tf.pad`'s paddings: one
  # where `step` starts a block, else none (None when static).
  new_blocks: typing.Any
  step: tf.Tensor
  # The scores' shapes [batch, heads, group, blocks * rows] and [batch,
  # heads, group, blocks, rows] (the batch as -1): attention's softmax runs
  # over the positions of every block at once.
  positions_shape: typing.Any
  blocks_shape: typing.Any


def plan_step(ancestors, step, group, heads, static):
  """What every layer's reads and writes share at position `step`,
  computed once a step.

  Args:
    ancestors: the ancestor table [batch, group, length].
    step: the position, a scalar int32.
    group: slots per sentence.
    heads: the attention heads of the buffers.
    static: XLA-safe ops over every block.
  Returns:
    (`ancestors` with each hypothesis computing `step` in its own slot, the
    `StepPlan`).
  """
  batch, _, length = dims(ancestors)
  here = tf.one_hot(step, length, True, False)
  # (expand_dims, not [tf.newaxis] slices: no kernel of its own)
  ancestors = tf.where(here, tf.expand_dims(tf.range(group), 1), ancestors)
  if static:
    num_blocks, slots = length // BLOCK_LENGTH, ancestors
  else:  # the blocks filled so far
    num_blocks = step // BLOCK_LENGTH + 1
    # The slice's end as [0, 0, n * BLOCK_LENGTH] from one multiply (the
    # first two axes whole): `[:, :, :n]` packs its end in a kernel of its
    # own.
    end = tf.constant([0, 0, BLOCK_LENGTH]) * num_blocks
    slots = tf.strided_slice(ancestors, [0, 0, 0], end, end_mask=0b011)
  # True where a key row holds the query's ancestor at that position (its
  # slot) and the position is at most `step` (one_hot of -1 is all False).
  select = tf.reshape(tf.one_hot(slots, group, True, False),
                      [batch, group, num_blocks, BLOCK_LENGTH * group])
  select = tf.expand_dims(tf.transpose(select, [2, 0, 1, 3]), 2)
  block_rows = BLOCK_LENGTH * group
  if static:  # (a scatter writes, and a range needs static ends)
    return ancestors, StepPlan(
        True, num_blocks, select, None, None, step,
        [-1, heads, group, num_blocks * block_rows],
        [-1, heads, group, num_blocks, block_rows])
  # The rows of a buffer's [num_blocks * batch * heads * BLOCK_LENGTH,
  # group * depth] view that hold position `step`: one in every
  # BLOCK_LENGTH of its block's.
  rows_per_block = batch * (heads * BLOCK_LENGTH)
  first = step // BLOCK_LENGTH * rows_per_block + step % BLOCK_LENGTH
  rows = tf.range(first, first + rows_per_block, BLOCK_LENGTH)
  # Blocks before this step: step / BLOCK_LENGTH rounded up.
  grow = num_blocks - (step + BLOCK_LENGTH - 1) // BLOCK_LENGTH
  new_blocks = tf.constant([[0, 1], [0, 0], [0, 0], [0, 0], [0, 0]]) * grow
  blocks = tf.reshape(num_blocks, [1])  # (two concats, once a step)
  return ancestors, StepPlan(
      False, num_blocks, select, rows, new_blocks, step,
      tf.concat([[-1, heads, group], blocks * block_rows], 0),
      tf.concat([[-1, heads, group], blocks, [block_rows]], 0))


def write(cache_buffer, new, plan):
  """Writes the keys or values of position `plan.step`.

  Args:
    cache_buffer: from `buffer`.
    new: [batch, heads, group, depth].
    plan: this step's `plan_step`.
  Returns:
    The buffer, written in place unless `plan.static`; with a new block
    where the step starts one.
  """
  if plan.static:
    num_blocks, batch, heads, rows, depth = dims(cache_buffer)
    group = rows // BLOCK_LENGTH
    block, offset = plan.step // BLOCK_LENGTH, plan.step % BLOCK_LENGTH
    where = tf.stack(tf.meshgrid(tf.range(batch), tf.range(heads),
                                 indexing="ij"), axis=-1)
    where = tf.concat([tf.fill([batch, heads, 1], block), where,
                       tf.fill([batch, heads, 1], offset)], axis=-1)
    updated = tf.tensor_scatter_nd_update(
        tf.reshape(cache_buffer,
                   [num_blocks, batch, heads, BLOCK_LENGTH, group * depth]),
        where, tf.reshape(new, [batch, heads, group * depth]))
    return tf.reshape(updated, tf.shape(cache_buffer))
  grown = tf.pad(cache_buffer, plan.new_blocks)
  grown.set_shape([None] + cache_buffer.shape[1:])  # (only axis 0 grows)
  cache_buffer = grown
  row_size = cache_buffer.shape[3] // BLOCK_LENGTH * cache_buffer.shape[4]
  flat = tf.raw_ops.InplaceUpdate(
      x=tf.reshape(cache_buffer, [-1, row_size]), i=plan.rows,
      v=tf.reshape(new, [-1, row_size]))
  return tf.reshape(flat, tf.shape(cache_buffer))


def attend(query, key, value, plan):
  """Eq. 1 for one decoder position over the cached positions 0..step, each
  taken from the slot of the row's ancestor there.

  Args:
    query: Q W^Q heads [batch, heads, group, d_k], already scaled by
      1 / sqrt(d_k).
    key, value: buffers (`buffer`), position `plan.step` written: the
      blocks filled so far (every block when `plan.static`).
    plan: this step's `plan_step`.
  Returns:
    [batch, heads, group, d_v]. Every query of a sentence meets every
    slot's keys, one batched matmul per block; the rows that are not the
    query's ancestor (or lie after the step) get no weight, and the softmax
    runs over the blocks and their rows where they lie, so that neither the
    scores nor the weights are transposed.
  """
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
