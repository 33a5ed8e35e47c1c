"""Greedy decoding: one cached decoder step per output token.

Each sentence stops at EOS or after its source length + `max_length_offset`
tokens (section 6.1's maximum output length). Finished rows emit PAD.
"""

import tensorflow as tf

from tf_transformer.special_ids import BOS_ID, EOS_ID, PAD_ID


def greedy_search(model, source_ids, max_length_offset=50):
  """Returns (ids [batch, length] ending with EOS or cut at the limit, then
  PAD; scores [batch], the log-probability of each output)."""
  batch = tf.shape(source_ids)[0]
  memory, source_mask = model.encode(source_ids)
  limits = tf.reduce_sum(tf.cast(source_mask, tf.int32), 1) + max_length_offset
  max_length = tf.maximum(tf.reduce_max(limits), 1)  # an empty batch too
  cache = model.initial_cache(memory, max_length)
  outputs = tf.TensorArray(tf.int32, size=max_length)
  token = tf.fill([batch, 1], BOS_ID)
  finished = tf.zeros([batch], tf.bool)
  scores = tf.zeros([batch], tf.float32)
  step = tf.constant(0)
  while step < max_length and not tf.reduce_all(finished):
    logits, cache = model.decode(token, None, source_mask, cache=cache,
                                 step=step)
    log_probs = tf.nn.log_softmax(tf.cast(logits[:, 0], tf.float32))
    best = tf.argmax(log_probs, axis=-1, output_type=tf.int32)
    scores += tf.where(finished, 0.0, tf.reduce_max(log_probs, axis=-1))
    best = tf.where(finished, PAD_ID, best)
    outputs = outputs.write(step, best)
    finished = finished | tf.equal(best, EOS_ID) | (step + 1 >= limits)
    token = best[:, tf.newaxis]
    step += 1
  ids = tf.transpose(outputs.stack()[:step])
  return ids, scores
