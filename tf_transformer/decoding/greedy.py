"""Greedy decoding and sampling: one cached decoder step per output token.

Each sentence stops at EOS or after its source length + `max_length_offset`
tokens (section 6.1's maximum output length). Finished rows emit PAD.
Sampling draws each token from softmax(logits / temperature), optionally
restricted to the `top_k` most likely tokens and then to the nucleus of
`top_p` (Holtzman et al., 2020: the fewest most likely tokens whose
probabilities sum to at least `top_p`, in that order as CTranslate2,
fairseq and Transformers restrict them); scores are always the model's
own log P(Y|X), whatever the temperature, so samples rank like beams.
"""

import tensorflow as tf

from tf_transformer.choices import check_decoding
from tf_transformer.decoding import bans as bans_lib
from tf_transformer.decoding import cache as cache_lib
from tf_transformer.decoding import limits as limits_lib
from tf_transformer.decoding import prefix as prefix_lib
from tf_transformer.decoding import step as step_lib
from tf_transformer.layers import masks
from tf_transformer.decoding.ensemble import step_of
from tf_transformer import special_ids
from tf_transformer.special_ids import BOS_ID, EOS_ID, PAD_ID


def greedy_search(model, source_ids, max_length_offset=50, max_length=None,
                  step_weights=None, prefix=None, bans=bans_lib.Bans()):
  """The most likely token at each step.

  Args:
    model: a `Transformer` or an `Ensemble`.
    source_ids: [batch, source_length] int32, EOS-terminated, PAD-padded.
    max_length_offset: outputs have at most source length + this tokens.
    max_length: at least every limit; fixes the buffers' length, a static
      shape for XLA.
    step_weights: see `search.decode`.
    prefix: a `prefix.Prefix` each output starts with.
    bans: the tokens banned at a step (`bans.Bans`).
  Returns:
    (ids [batch, length] ending with EOS or cut at the limit, then PAD, with
    `max_length` columns where given; scores [batch], each output's
    log-probability).
  """
  def most_likely(log_probs, step):
    del step
    return tf.argmax(log_probs, axis=-1, output_type=tf.int32)
  return left_to_right(model, source_ids, most_likely, max_length_offset,
                       max_length, step_weights, prefix, bans)


def sample_search(model, source_ids, temperature=1.0, top_k=0,
                  max_length_offset=50, seed=None, max_length=None,
                  step_weights=None, prefix=None, top_p=1.0,
                  bans=bans_lib.Bans()):
  """Like `greedy_search`, drawing each token at random.

  Args:
    model, source_ids, max_length_offset, max_length, step_weights, prefix,
      bans: as `greedy_search`'s.
    temperature: the logits are divided by it before the draw.
    top_k: draw among the k most likely tokens only; 0: all.
    seed: an int makes the draws reproducible (stateless random ops);
      None: each call draws anew.
    top_p: then draw among the fewest most likely tokens whose
      probabilities (at `temperature`, after `top_k`) sum to at least
      `top_p`; 1: all.
  Returns:
    What `greedy_search` returns.
  """
  check_decoding(temperature=temperature, top_k=top_k, top_p=top_p)

  def draw(log_probs, step):
    logits = log_probs / temperature
    if top_k:
      vocab = logits.shape[-1] or tf.shape(logits)[-1]  # a shortlist's varies
      k = (min if isinstance(vocab, int) else tf.minimum)(top_k, vocab)
      kth_best = tf.math.top_k(logits, k=k).values[:, -1:]
      logits = tf.where(logits < kth_best, logits.dtype.min, logits)
    if top_p < 1:
      logits = nucleus(logits, top_p)
    if seed is None:
      drawn = tf.random.categorical(logits, 1, dtype=tf.int32)
    else:
      drawn = tf.random.stateless_categorical(
          logits, 1, seed=tf.stack([tf.constant(seed), step]),
          dtype=tf.int32)
    return drawn[:, 0]
  return left_to_right(model, source_ids, draw, max_length_offset,
                       max_length, step_weights, prefix, bans)


def nucleus(logits, top_p):
  """Nucleus sampling's restriction (Holtzman et al., 2020).

  Args:
    logits: [batch, vocab] float.
    top_p: in (0, 1).
  Returns:
    `logits` with every token outside the nucleus at the dtype's lowest
    value: a token stays where the tokens more likely than it hold less
    than `top_p` of softmax(logits) (so the most likely always stays).
  """
  descending = tf.sort(logits, axis=-1, direction="DESCENDING")
  before = tf.math.cumsum(tf.nn.softmax(descending), axis=-1,
                          exclusive=True)
  kept = tf.reduce_sum(tf.cast(before < top_p, tf.int32), axis=-1,
                       keepdims=True)
  lowest_kept = tf.gather(descending, kept - 1, batch_dims=1)
  return tf.where(logits < lowest_kept, logits.dtype.min, logits)


def left_to_right(model, source_ids, pick, max_length_offset=50,
                  max_length=None, step_weights=None, prefix=None,
                  bans=bans_lib.Bans()):
  """The loop both share: `pick(log_probs [batch, vocab], step) -> [batch]`
  chooses each next token; `prefix` (`decoding/prefix.py`) forces the
  first ones; `bans` (`decoding/bans.py`) bans some."""
  fixed_length = max_length is not None
  decoder = step_of(model, static=fixed_length)
  batch = tf.shape(source_ids)[0]
  # (The limits need only the mask; the encoder, the step's weights.)
  source_mask = masks.padding_mask(source_ids)
  limits, max_length = limits_lib.output_limits(source_mask,
                                                max_length_offset, max_length)
  weights = step_lib.read(decoder, step_weights, max_length)
  memory, source_mask = decoder.encode(source_ids, weights)
  cache = decoder.initial_cache(weights, memory, max_length)
  never = special_ids.never_output(decoder.config.model.decoder_start)
  if fixed_length:  # a [batch, max_length] PAD buffer: static shapes
    outputs = tf.fill([batch, max_length], PAD_ID)
    write = lambda outputs, step, chosen: tf.where(
        tf.range(max_length) == step, chosen[:, tf.newaxis], outputs)
    result = lambda outputs, step: outputs
  else:  # as long as the loop runs
    outputs = tf.TensorArray(tf.int32, size=max_length,
                             element_shape=source_ids.shape[:1])
    write = lambda outputs, step, chosen: outputs.write(step, chosen)
    result = lambda outputs, step: tf.transpose(outputs.stack()[:step])

  def body(step, token, cache, finished, scores, outputs, history):
    logits, cache = decoder(token, step, cache, source_mask, weights)
    if prefix is not None:
      logits = prefix_lib.force(logits, step, prefix)
    if bans.need_history:
      history = bans_lib.write(history, step, token)
    logits = bans_lib.apply(logits, step, bans, history,
                            None if prefix is None else prefix.lengths)
    log_probs = tf.nn.log_softmax(logits)
    allowed = tf.where(limits_lib.never_output(
                           log_probs.shape[-1] or tf.shape(log_probs)[-1],
                           never),
                       log_probs.dtype.min, log_probs)
    chosen = pick(allowed, step)
    chosen_log_prob = tf.gather(log_probs, chosen, batch_dims=1)
    scores += tf.where(finished, 0.0, chosen_log_prob)
    chosen = tf.where(finished, PAD_ID, chosen)
    outputs = write(outputs, step, chosen)
    finished = finished | tf.equal(chosen, EOS_ID) | (step + 1 >= limits)
    return (step + 1, chosen[:, tf.newaxis], cache, finished, scores,
            outputs, history)

  def not_done(step, token, cache, finished, scores, outputs, history):
    del token, cache, scores, outputs, history
    return (step < max_length) & ~tf.reduce_all(finished)

  # The outputs so far where a ban reads them (else an empty placeholder).
  history = tf.fill([batch, max_length if bans.need_history else 0], PAD_ID)
  loop_vars = (tf.constant(0), tf.fill([batch, 1], BOS_ID), cache,
               tf.zeros([batch], tf.bool), tf.zeros([batch], tf.float32),
               outputs, history)
  # A tf.while_loop, as beam search's (the package traces without
  # AutoGraph). The cache's buffers grow by blocks (cache.loop_shapes); the
  # rest keep their shapes.
  step, _, _, _, scores, outputs, _ = tf.while_loop(
      not_done, body, loop_vars,
      shape_invariants=(None, None, cache_lib.loop_shapes(cache), None, None,
                        None, None))
  return result(outputs, step), scores
