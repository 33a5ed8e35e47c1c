"""Beam search over a cached decoder step (section 6.1).

    ids, scores = beam_search(symbols_to_logits, initial_cache, batch_size,
                              limits, max_length, beam_size=4, alpha=0.6)

`symbols_to_logits(ids [batch*beam, 1], step, cache) -> (logits, cache)` runs
one decoder position; it is called once per output token, never on the whole
prefix. Scores are log P(Y|X) / lp(Y) with GNMT's length penalty
lp(Y) = ((5 + |Y|) / 6)^alpha (|Y| counts the EOS).

Live and finished hypotheses are kept apart, as in the TF Model Garden: each
step scores 2 * beam_size candidates, so an end-of-sentence candidate goes to
the finished set without taking a live slot, and finished hypotheses never
grow again. A sentence stops at its own limit (`limits`, e.g. source length +
50): the candidates of that step are finished as they are. The search ends
when every sentence's worst finished score beats the best score a live
hypothesis could still reach (its log-probability, which can only fall,
under the largest length penalty it could get). Buffers have the static
length `max_length`, so the loop compiles once under XLA.

Core TensorFlow ops only (no tensorflow-addons GatherTree): exports load in
stock TensorFlow Serving.
"""

import tensorflow as tf

from tf_transformer.special_ids import BOS_ID, EOS_ID, PAD_ID

NEG_INF = -1e9  # scores are float32 whatever the model's dtype


def length_penalty(length, alpha):
  """GNMT's lp(Y) = ((5 + |Y|) / 6)^alpha."""
  return tf.pow((5.0 + tf.cast(length, tf.float32)) / 6.0, alpha)


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


def beam_search(symbols_to_logits, initial_cache, batch_size, limits,
                max_length, beam_size=4, alpha=0.6, static_cache_keys=(),
                reorder_cache=None):
  """Returns (ids [batch, beam, max_length], scores [batch, beam]), best
  first. `limits` [batch]: the most tokens each output may have (EOS
  included), at most `max_length`.

  After each step the cache follows its hypotheses:
  `reorder_cache(cache, parents)`, parents [batch, beam] the slot each new
  hypothesis comes from (the decoder's own, `Decoder.reorder_cache`, moves no
  key or value). Without it every entry of a cache flat over batch*beam rows
  is gathered, except those named in `static_cache_keys` (entries identical
  across a sentence's beams)."""
  k = beam_size
  limits = tf.minimum(tf.cast(limits, tf.int32), max_length)
  positions = tf.range(max_length)[tf.newaxis, tf.newaxis, :]

  alive_seq = tf.fill([batch_size, k, max_length], PAD_ID)
  # Only the first beam is live at the start, so k copies are not k hypotheses.
  alive_log_probs = tf.tile(
      tf.constant([[0.0] + [NEG_INF] * (k - 1)]), [batch_size, 1])
  finished_seq = tf.fill([batch_size, k, max_length], PAD_ID)
  finished_scores = tf.fill([batch_size, k], NEG_INF)
  finished_flags = tf.zeros([batch_size, k], tf.bool)
  last_tokens = tf.fill([batch_size * k, 1], BOS_ID)

  def gather_cache(cache, beam_indices):
    def reorder(path, value):
      if any(key in path for key in static_cache_keys):
        return value
      return _flatten(tf.gather(_unflatten(value, batch_size, k),
                                beam_indices, batch_dims=1))
    return _map_with_path(reorder, cache)

  reorder_cache = reorder_cache or gather_cache

  def step_fn(step, alive_seq, alive_log_probs, finished_seq, finished_scores,
              finished_flags, last_tokens, cache):
    logits, cache = symbols_to_logits(last_tokens, step, cache)
    log_probs = tf.nn.log_softmax(tf.cast(logits[:, -1], tf.float32))
    vocab_size = tf.shape(log_probs)[-1]
    log_probs = _unflatten(log_probs, batch_size, k)
    candidates = alive_log_probs[:, :, tf.newaxis] + log_probs
    flat = tf.reshape(candidates, [batch_size, -1])
    top_log_probs, top_indices = tf.math.top_k(flat, k=2 * k)
    top_beams = top_indices // vocab_size
    top_ids = top_indices % vocab_size
    top_seq = tf.gather(alive_seq, top_beams, batch_dims=1)
    top_seq = tf.where(positions == step, top_ids[:, :, tf.newaxis], top_seq)
    length = step + 1
    ends = tf.equal(top_ids, EOS_ID) | (length >= limits)[:, tf.newaxis]
    # Candidates that died on the way (from the NEG_INF placeholder beams)
    # are neither live nor finished.
    valid = top_log_probs > NEG_INF / 2

    # Live: the best k candidates that do not end here.
    live_scores = tf.where(ends | ~valid, NEG_INF, top_log_probs)
    live_scores, live_indices = tf.math.top_k(live_scores, k=k)
    new_alive_seq = tf.gather(top_seq, live_indices, batch_dims=1)
    new_alive_beams = tf.gather(top_beams, live_indices, batch_dims=1)
    new_last = tf.reshape(tf.gather(top_ids, live_indices, batch_dims=1),
                          [batch_size * k, 1])
    cache = reorder_cache(cache, new_alive_beams)

    # Finished: merge the ending candidates with those finished before.
    new_scores = tf.where(ends & valid,
                          top_log_probs / length_penalty(length, alpha),
                          NEG_INF)
    all_seq = tf.concat([finished_seq, top_seq], axis=1)
    all_scores = tf.concat([finished_scores, new_scores], axis=1)
    all_flags = tf.concat([finished_flags, ends & valid], axis=1)
    finished_scores, keep = tf.math.top_k(all_scores, k=k)
    finished_seq = tf.gather(all_seq, keep, batch_dims=1)
    finished_flags = tf.gather(all_flags, keep, batch_dims=1)
    return (step + 1, new_alive_seq, live_scores, finished_seq,
            finished_scores, finished_flags, new_last, cache)

  def continue_search(step, alive_seq, alive_log_probs, finished_seq,
                      finished_scores, finished_flags, last_tokens, cache):
    del alive_seq, finished_seq, last_tokens, cache
    # Best score a live hypothesis could still reach, per sentence: its
    # log-probability only falls, the penalty is largest at its limit.
    best_possible = alive_log_probs[:, 0] / length_penalty(limits, alpha)
    worst_finished = tf.reduce_min(
        tf.where(finished_flags, finished_scores, -NEG_INF), axis=1)
    worst_finished = tf.where(tf.reduce_all(finished_flags, axis=1),
                              worst_finished, NEG_INF)
    some_alive = alive_log_probs[:, 0] > NEG_INF / 2
    done = (worst_finished >= best_possible) | ~some_alive | (step >= limits)
    return (step < max_length) & ~tf.reduce_all(done)

  state = (tf.constant(0), alive_seq, alive_log_probs, finished_seq,
           finished_scores, finished_flags, last_tokens, initial_cache)
  # The batch may be unknown inside the loop; every other size is fixed.
  shapes = tf.nest.map_structure(
      lambda x: tf.TensorShape([None]).concatenate(x.shape[1:])
      if x.shape.rank else x.shape, state)
  (_, alive_seq, alive_log_probs, finished_seq, finished_scores,
   finished_flags, _, _) = tf.while_loop(
       continue_search, step_fn, state, shape_invariants=shapes,
       maximum_iterations=max_length)
  # A sentence with no finished hypothesis (the search hit max_length)
  # returns its live ones.
  any_finished = tf.reduce_any(finished_flags, axis=1)
  ids = tf.where(any_finished[:, tf.newaxis, tf.newaxis], finished_seq,
                 alive_seq)
  scores = tf.where(any_finished[:, tf.newaxis], finished_scores,
                    alive_log_probs / length_penalty(limits, alpha)[:, None])
  return ids, scores


def _map_with_path(fn, structure, path=()):
  if isinstance(structure, dict):
    return {key: _map_with_path(fn, value, path + (key,))
            for key, value in structure.items()}
  return fn(path, structure)
