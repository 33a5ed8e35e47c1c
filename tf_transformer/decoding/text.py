"""Text in, text out around a decoding function, in batches (eager)."""

import numpy as np
import tensorflow as tf

from tf_transformer.data import sequences


def translate(decode_fn, vocabulary, texts, batch_tokens=4096,
              max_batch_size=256):
  """Applies `decode_fn(source_ids) -> ids [batch, length]` to `texts` and
  returns the detokenized outputs, in the order of `texts`. The texts are
  decoded sorted by length, in batches of about `batch_tokens` source
  subwords (at most `max_batch_size` sentences), so that little of a batch
  is padding and a dev set costs a few batches."""
  if not texts:
    return []
  ids = sequences.source_ids(vocabulary, tf.constant(texts))
  lengths = ids.row_lengths().numpy()
  order = np.argsort(lengths, kind="stable")
  outputs = [None] * len(texts)
  start = 0
  while start < len(order):
    end = start + 1
    while end < len(order) and end - start < max_batch_size and (
        (end + 1 - start) * lengths[order[end]] <= batch_tokens):
      end += 1
    rows = order[start:end]
    decoded = decode_fn(tf.gather(ids, rows).to_tensor())
    for row, text in zip(rows, vocabulary.detokenize(decoded).numpy()):
      outputs[row] = text.decode("utf-8")
    start = end
  return outputs
