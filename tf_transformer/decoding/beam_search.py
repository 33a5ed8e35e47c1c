"""Beam search over a cached decoder step (section 6.1).

    ids, scores = beam_search(symbols_to_logits, initial_cache, batch_size,
                              limits, max_length, beam_size=4, alpha=0.6)

`symbols_to_logits(ids [batch*beam, 1], step, cache) -> (logits, cache)` runs
one decoder position (logits [batch*beam, vocab]);
it is called once per output token, never on the whole prefix. Scores are log P(Y|X) / lp(Y) with GNMT's length penalty
lp(Y) = ((5 + |Y|) / 6)^alpha (|Y| counts the EOS).

Live and finished hypotheses are kept apart, as in the TF Model Garden: each
step scores 2 * beam_size candidates, so an end-of-sentence candidate goes to
the finished set without taking a live slot, and finished hypotheses never
grow again. A sentence's search is over ("early stop") when
- `beam_size` hypotheses have finished among the top `beam_size` candidates
  of its steps (fairseq's and CTranslate2's rule) and none of its live
  hypotheses scores better, as it stands, than its best finished one;
- or its worst finished score beats the best score a live hypothesis could
  still reach (its log-probability, which can only fall, under the largest
  length penalty it could get): nothing can change any more;
- or at its own limit (`limits`, e.g. source length + 50), where the
  candidates of that step are finished as they are.
The first rule stops most sentences well before the second would
(docs/performance.md); without its second half it would stop too soon for
weak models, before a hypothesis that still scores better has finished.

Sentences whose search is over leave the batch (`select_cache`), so later
steps compute only the rest; their results are fixed from the step they are
done, so they do not depend on when they leave or on the other sentences of
the batch. Under XLA nothing leaves (every shape stays static).

Core TensorFlow ops only (no tensorflow-addons GatherTree): exports load in
stock TensorFlow Serving.
"""

import typing

import tensorflow as tf

from tf_transformer.decoding import limits as limits_lib
from tf_transformer.decoding.limits import NEG_INF
from tf_transformer.special_ids import BOS_ID, EOS_ID, NEVER_OUTPUT, PAD_ID

RETIRE_FRACTION = 4  # done sentences leave once they are 1/4 of the batch


def length_penalty(length, alpha):
  """GNMT's lp(Y) = ((5 + |Y|) / 6)^alpha."""
  return tf.pow((5.0 + tf.cast(length, tf.float32)) / 6.0, alpha)


def top_k(x, k, block=64):
  """tf.math.top_k(x, k) over the last axis of a [rows, n] tensor, for a
  vocabulary: the k best values lie in the k blocks of `block` columns with
  the best maxima, so one reduction over all columns and two top-k over
  k * block of them replace a top-k over all n (faster than TopKV2 there:
  docs/performance.md). A shortlist's n varies by request (unknown in the
  graph): blocks of SHORTLIST_BLOCK columns, chosen at run time where n is
  large enough."""
  n = x.shape[-1]
  if n is None:
    n = tf.shape(x)[-1]
    return tf.cond(n < 4 * k * SHORTLIST_BLOCK,
                   lambda: tuple(tf.math.top_k(x, k=k)),
                   lambda: _blocked_top_k(x, k, SHORTLIST_BLOCK, n))
  if n < 4 * k * block:
    return tf.math.top_k(x, k=k)
  return _blocked_top_k(x, k, block, n)


# Columns a block where the vocabulary's width varies (a shortlist's, of
# about 700-2,500 pieces a request): at 128 rows and 2,200 columns, blocks
# of 16 or 32 took 0.55-0.6x TopKV2's time, 64 0.7x (docs/performance.md).
SHORTLIST_BLOCK = 32


def _blocked_top_k(x, k, block, n):
  """`top_k` over blocks of `block` columns; n: x's width, an int (static
  sizes but the rows: no shape kernel at every step) or a scalar tensor."""
  num_blocks = (n + block - 1) // block
  if isinstance(n, int):
    if n % block:
      x = tf.pad(x, [[0, 0], [0, block - n % block]],
                 constant_values=float("-inf"))
    blocks = tf.reshape(x, [-1, num_blocks, block])
  else:
    x = tf.pad(x, [[0, 0], [0, num_blocks * block - n]],
               constant_values=float("-inf"))
    blocks = tf.reshape(x, tf.stack([-1, num_blocks, block]))
  _, best_blocks = tf.math.top_k(tf.reduce_max(blocks, -1), k=k)
  candidates = tf.reshape(tf.gather(blocks, best_blocks, batch_dims=1),
                          [-1, k * block])
  values, where = tf.math.top_k(candidates, k=k)
  # The columns of the best blocks, read from a table of column ids: two
  # gathers, where arithmetic on block and offset took five kernels.
  columns = tf.reshape(tf.range(num_blocks * block), [-1, block])
  ids = tf.gather(tf.reshape(tf.gather(columns, best_blocks), [-1, k * block]),
                  where, batch_dims=1)
  return values, ids


def _flatten(x):
  """[batch, beam, ...] -> [batch * beam, ...]."""
  shape = tf.shape(x)
  return tf.reshape(x, tf.concat([[shape[0] * shape[1]], shape[2:]], 0))


def _unflatten(x, batch_size, beam_size):
  shape = tf.shape(x)
  return tf.reshape(x, tf.concat([[batch_size, beam_size], shape[1:]], 0))


def tile_beams(x, beam_size):
  """[batch, ...] -> [batch * beam, ...], each row repeated beam_size times."""
  return tf.repeat(x, beam_size, axis=0)


class _Search(typing.NamedTuple):
  """The loop state of the sentences still searching: [batch, beam, ...]
  hypotheses, except `last_tokens` [batch * beam, 1], `finished_count`,
  `done`, `limits` and `limit_penalties` [batch], and the decoder's
  cache. A finished slot holds a hypothesis when its score is above
  NEG_INF / 2 (the empty ones score NEG_INF, and sort last)."""
  alive_seq: tf.Tensor
  alive_log_probs: tf.Tensor
  finished_seq: tf.Tensor
  finished_scores: tf.Tensor
  finished_count: tf.Tensor  # hypotheses finished among the top k
  done: tf.Tensor  # the search of this sentence is over
  last_tokens: tf.Tensor
  limits: tf.Tensor
  limit_penalties: tf.Tensor  # lp(limit), the largest a sentence can get
  cache: dict


def final_hypotheses(state):
  """(ids [batch, beam, length], scores [batch, beam]) of a search's state:
  the finished hypotheses, or for a sentence with none (the search hit its
  limit) the live ones, scored at their limit."""
  any_finished = state.finished_scores[:, 0] > NEG_INF / 2
  ids = tf.where(any_finished[:, tf.newaxis, tf.newaxis], state.finished_seq,
                 state.alive_seq)
  scores = tf.where(any_finished[:, tf.newaxis], state.finished_scores,
                    state.alive_log_probs
                    / state.limit_penalties[:, tf.newaxis])
  return ids, scores


def _done(state, penalty, beam_size):
  """[batch] bool: the sentences whose search is over (the module
  docstring's three rules; `penalty` lp of this step's length). At its
  limit every candidate ends, so no live hypothesis is left."""
  best_alive = state.alive_log_probs[:, 0]
  # (One Unpack rather than a slice kernel for each end.)
  finished = tf.unstack(state.finished_scores, num=beam_size, axis=1)
  best_finished, worst_finished = finished[0], finished[-1]
  # The worst of k finished (NEG_INF while fewer than k are: slots sort
  # best first) against the best a live one could still reach.
  hopeless = worst_finished >= best_alive / state.limit_penalties
  enough = ((state.finished_count >= beam_size)
            & (best_finished >= best_alive / penalty))
  return enough | hopeless | (best_alive <= NEG_INF / 2)


class _Candidates(typing.NamedTuple):
  """The best 2k continuations of each sentence's live hypotheses, best
  first ([batch, 2k], `seq` [batch, 2k, max_length])."""
  log_probs: tf.Tensor
  beams: tf.Tensor  # the live slot each continues
  ids: tf.Tensor  # its new token
  seq: tf.Tensor
  ends: tf.Tensor  # EOS, or the sentence's limit reached
  valid: tf.Tensor  # not grown from a dead (NEG_INF) placeholder


def _grow_alive(logits, state, step, k, positions, never_output):
  """`_Candidates` of step `step` from the live hypotheses' next-token
  `logits` [batch * k, vocab] (float32).

  The best 2k continuations of each hypothesis hold the best 2k of its
  sentence: rank those only, and normalize only them (log-softmax is
  logits - logsumexp, whose maximum is the first of the row's best).
  The `never_output` ids are never candidates: the best 2k others are
  among a row's best 2k + len(never_output) (their probability still counts
  in the normalization, as in greedy decoding)."""
  vocab = logits.shape[-1] or tf.shape(logits)[-1]  # a shortlist's varies
  per_row = (min if isinstance(vocab, int) else tf.minimum)(
      2 * k + len(never_output), vocab)
  row_logits, row_ids = top_k(logits, per_row)
  row_max = row_logits[:, :1]
  log_normalizer = row_max + tf.math.log(
      tf.reduce_sum(tf.exp(logits - row_max), -1, keepdims=True))
  # (A lookup in a constant table: one kernel, where comparing with each
  # id and reducing took two.)
  never = tf.gather(limits_lib.never_output(vocab, never_output), row_ids)
  row_log_probs = tf.where(never, NEG_INF, row_logits - log_normalizer)
  candidates = (tf.reshape(row_log_probs, [-1, k, per_row])
                + tf.expand_dims(state.alive_log_probs, 2))
  log_probs, indices = tf.math.top_k(
      tf.reshape(candidates, [-1, k * per_row]), k=2 * k)
  # A sentence whose search is over grows nothing: its finished hypotheses
  # stay as they are (whenever it leaves the batch, or if it never does,
  # under XLA).
  log_probs = tf.where(tf.expand_dims(state.done, 1), NEG_INF, log_probs)
  beams = indices // per_row
  ids = tf.gather(tf.reshape(row_ids, [-1, k * per_row]), indices,
                  batch_dims=1)
  seq = tf.where(positions == step, tf.expand_dims(ids, 2),
                 tf.gather(state.alive_seq, beams, batch_dims=1))
  ends = tf.equal(ids, EOS_ID) | tf.expand_dims(step + 1 >= state.limits, 1)
  return _Candidates(log_probs, beams, ids, seq, ends,
                     log_probs > NEG_INF / 2)


def _new_alive(candidates, k):
  """(seq, log_probs, slots of origin [batch, k], tokens [batch * k, 1]):
  the best k candidates that do not end here."""
  # (A dead candidate, not valid, scores NEG_INF or about it already.)
  scores = tf.where(candidates.ends, NEG_INF, candidates.log_probs)
  scores, kept = tf.math.top_k(scores, k=k)
  tokens = tf.gather(candidates.ids, kept, batch_dims=1)
  return (tf.gather(candidates.seq, kept, batch_dims=1), scores,
          tf.gather(candidates.beams, kept, batch_dims=1),
          tf.reshape(tokens, [-1, 1]))


def _new_finished(state, candidates, penalty, k):
  """(seq, scores, count): the ending candidates (scored under `penalty`,
  lp of their length) merged with the hypotheses finished before, the best
  k kept (on ties the earlier: a done sentence, which has no candidates,
  keeps its own). `count` adds the hypotheses that finished among the k
  best candidates (the first rule that ends a search)."""
  finishing = candidates.ends & candidates.valid
  new_scores = tf.where(finishing, candidates.log_probs / penalty, NEG_INF)
  scores, keep = tf.math.top_k(
      tf.concat([state.finished_scores, new_scores], axis=1), k=k)
  seq = tf.gather(tf.concat([state.finished_seq, candidates.seq], axis=1),
                  keep, batch_dims=1)
  count = state.finished_count + tf.reduce_sum(
      tf.cast(finishing[:, :k], tf.int32), 1)
  return seq, scores, count


# The state's entries with one row per sentence (all but the hypotheses'
# last tokens, one row each, and the decoder's cache).
_PER_SENTENCE = tuple(name for name in _Search._fields
                      if name not in ("last_tokens", "cache"))


def _retire(state, output, done, k, select_cache):
  """Writes the done sentences' results to `output` (sentence positions,
  ids, scores) and drops them from the state."""
  sentences, out_ids, out_scores = output
  ids, scores = final_hypotheses(state)
  where = tf.boolean_mask(sentences, done)[:, tf.newaxis]
  out_ids = tf.tensor_scatter_nd_update(out_ids, where,
                                        tf.boolean_mask(ids, done))
  out_scores = tf.tensor_scatter_nd_update(out_scores, where,
                                           tf.boolean_mask(scores, done))
  keep = tf.cast(tf.where(~done)[:, 0], tf.int32)
  rows = tf.shape(state.alive_seq)[0]
  state = state._replace(
      **{name: tf.gather(getattr(state, name), keep)
         for name in _PER_SENTENCE},
      last_tokens=_flatten(tf.gather(_unflatten(state.last_tokens, rows, k),
                                     keep)),
      cache=select_cache(state.cache, keep))
  return state, (tf.gather(sentences, keep), out_ids, out_scores)


def beam_search(symbols_to_logits, initial_cache, batch_size, limits,
                max_length, beam_size=4, alpha=0.6, *, reorder_cache,
                select_cache=None, cache_batch_axes=None,
                never_output=NEVER_OUTPUT):
  """Beam search with GNMT's length penalty (section 6.1).

  After each step the cache follows its hypotheses through `reorder_cache`
  (the decoder's own, `decoding/cache.reorder`, moves no key or value). With
  `select_cache` and `cache_batch_axes`, done sentences leave the batch
  (once they are 1 / RETIRE_FRACTION of it), so later steps compute only the
  sentences still searching, as CTranslate2's do; without them every
  sentence is computed until the last one is done: static shapes, which XLA
  needs. Either way, each sentence gets the same hypotheses and scores.

  Args:
    symbols_to_logits: (ids [rows, 1], step, cache) -> (logits [rows,
      vocab] float32, cache), rows = sentences x beam.
    initial_cache: the decoder's cache before the first step.
    batch_size: the sentences.
    limits: [batch], the most tokens each output may have (EOS included),
      at most `max_length`.
    max_length: the buffers' length.
    beam_size: k (4 in the paper).
    alpha: the length penalty's alpha (0.6 in the paper).
    reorder_cache: (cache, parents [batch, beam]) -> cache, parents the slot
      each new hypothesis comes from.
    select_cache: (cache, sentences [n]) -> the cache of those sentences.
    cache_batch_axes: the cache's structure with each entry's sentence axis.
    never_output: ids never output (the model's
      `special_ids.never_output(...)`).
  Returns:
    (ids [batch, beam, max_length], scores [batch, beam]), best first,
    scores log P(Y|X) / lp(Y).
  """
  k = beam_size
  positions = tf.range(max_length)[tf.newaxis, tf.newaxis, :]
  limits = tf.minimum(tf.cast(limits, tf.int32), max_length)
  penalties = length_penalty(tf.range(max_length + 1), alpha)  # by length
  compact = select_cache is not None

  def step_fn(step, state, output):
    logits, cache = symbols_to_logits(state.last_tokens, step, state.cache)
    candidates = _grow_alive(tf.cast(logits, tf.float32), state, step, k,
                             positions, never_output)
    alive_seq, alive_log_probs, parents, last_tokens = _new_alive(
        candidates, k)
    penalty = penalties[step + 1]  # lp of the candidates' length
    finished_seq, finished_scores, finished_count = _new_finished(
        state, candidates, penalty, k)
    state = state._replace(
        alive_seq=alive_seq, alive_log_probs=alive_log_probs,
        finished_seq=finished_seq, finished_scores=finished_scores,
        finished_count=finished_count,
        last_tokens=last_tokens, cache=reorder_cache(cache, parents))
    done = state.done | _done(state, penalty, k)
    state = state._replace(done=done)
    if compact:
      # Leaving copies the cache: wait until it pays, i.e. until a
      # quarter of the batch is done (docs/performance.md). (All done is a
      # quarter too.)
      leave = (tf.reduce_mean(tf.cast(done, tf.float32))
               >= 1 / RETIRE_FRACTION)
      state, output = tf.cond(
          leave,
          lambda: _retire(state, output, done, k, select_cache),
          lambda: (state, output))
    return step + 1, state, output

  def continue_search(step, state, output):
    if compact:
      return (step < max_length) & (tf.size(output[0]) > 0)
    return (step < max_length) & ~tf.reduce_all(state.done)

  state = _Search(
      alive_seq=tf.fill([batch_size, k, max_length], PAD_ID),
      # Only the first beam is live at the start, so k copies are not k
      # hypotheses.
      alive_log_probs=tf.tile(tf.constant([[0.0] + [NEG_INF] * (k - 1)]),
                              [batch_size, 1]),
      finished_seq=tf.fill([batch_size, k, max_length], PAD_ID),
      finished_scores=tf.fill([batch_size, k], NEG_INF),
      finished_count=tf.zeros([batch_size], tf.int32),
      done=tf.zeros([batch_size], tf.bool),
      last_tokens=tf.fill([batch_size * k, 1], BOS_ID),
      limits=limits,
      limit_penalties=tf.gather(penalties, limits),
      cache=initial_cache)
  output = (tf.range(batch_size), tf.fill([batch_size, k, max_length], PAD_ID),
            tf.fill([batch_size, k], NEG_INF))
  # Sentences leave the batch (along axis 0 of every entry, and the
  # cache's own sentence axes); every other size is fixed.
  axes = _Search(**{name: 0 for name in _Search._fields[:-1]},
                 cache=cache_batch_axes if compact else
                 tf.nest.map_structure(lambda _: 0, initial_cache))
  shapes = tf.nest.map_structure(_relaxed, state, axes)
  _, state, output = tf.while_loop(
      continue_search, step_fn, (tf.constant(0), state, output),
      shape_invariants=(tf.TensorShape([]), shapes,
                        (tf.TensorShape([None]), output[1].shape,
                         output[2].shape)),
      maximum_iterations=max_length)
  sentences, out_ids, out_scores = output
  ids, scores = final_hypotheses(state)
  where = sentences[:, tf.newaxis]
  return (tf.tensor_scatter_nd_update(out_ids, where, ids),
          tf.tensor_scatter_nd_update(out_scores, where, scores))


def _relaxed(x, axis):
  """x's shape with its first axis and its sentence `axis` unknown."""
  if not x.shape.rank:
    return x.shape
  dims = x.shape.as_list()
  dims[0] = dims[axis] = None
  return tf.TensorShape(dims)
