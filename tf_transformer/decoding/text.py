"""Text in, text out around a decoding function, in batches (eager)."""

import tensorflow as tf

from tf_transformer.data import sequences


def translate(decode_fn, vocabulary, texts, batch_size=64):
  """Applies `decode_fn(source_ids) -> (ids, scores)` to `texts` in batches
  and returns the detokenized outputs."""
  outputs = []
  for start in range(0, len(texts), batch_size):
    source_ids = sequences.source_ids(
        vocabulary, tf.constant(texts[start:start + batch_size])).to_tensor()
    ids, _ = decode_fn(source_ids)
    outputs += [t.decode("utf-8") for t in
                vocabulary.detokenize(ids).numpy()]
  return outputs
