"""Text in, text out around a decoding function, in batches (eager)."""

import tensorflow as tf

from tf_transformer.special_ids import EOS_ID


def encode_sources(vocabulary, texts):
  """[batch] strings -> [batch, length] source ids ending with EOS, padded."""
  ids = vocabulary.tokenize(tf.constant(texts))
  eos = tf.fill([ids.nrows(), 1], EOS_ID)
  return tf.concat([ids, eos], axis=1).to_tensor()


def translate(decode_fn, vocabulary, texts, batch_size=64):
  """Applies `decode_fn(source_ids) -> (ids, scores)` to `texts` in batches
  and returns the detokenized outputs."""
  outputs = []
  for start in range(0, len(texts), batch_size):
    source_ids = encode_sources(vocabulary, texts[start:start + batch_size])
    ids, _ = decode_fn(source_ids)
    outputs += [t.decode("utf-8") for t in
                vocabulary.detokenize(ids).numpy()]
  return outputs
