"""Text in, text out around a decoding function, in batches (eager)."""

import tensorflow as tf

from tf_transformer.data import sequences


def translate(decode_fn, vocabulary, texts, batch_tokens=4096,
              max_batch_size=256):
  """Decodes texts in batches of similar length, so that little of a
  batch is padding and a dev set costs a few batches.

  Args:
    decode_fn: source_ids [batch, length] -> output ids [batch, length'].
    vocabulary: the run's `Vocabulary` (tokenizes and detokenizes).
    texts: source strings.
    batch_tokens, max_batch_size: each batch's budget (`length_batches`).
  Returns:
    The detokenized outputs, in the order of `texts`.
  """
  if not texts:
    return []
  ids = sequences.source_ids(vocabulary, tf.constant(texts))
  outputs = [None] * len(texts)
  for rows in length_batches(ids.row_lengths().numpy(), batch_tokens,
                             max_batch_size):
    decoded = decode_fn(tf.gather(ids, rows).to_tensor())
    for row, text in zip(rows, vocabulary.detokenize(decoded).numpy()):
      outputs[row] = text.decode("utf-8")
  return outputs


def length_batches(lengths, batch_tokens, max_sentences):
  """Batches of texts of similar length, as OpenNMT-tf, fairseq and Marian
  batch a file.

  Args:
    lengths: each text's length in tokens.
    batch_tokens: the padded tokens a batch may hold (its longest length
      times its count); a text longer than that goes alone.
    max_sentences: the texts a batch may hold.
  Returns:
    Lists of indices into `lengths`, sorted by length, longest first (so
    that a budget that is too large shows at once).
  """
  batches, batch, longest = [], [], 0
  for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
    longest_with = max(longest, lengths[i])
    if batch and (longest_with * (len(batch) + 1) > batch_tokens
                  or len(batch) == max_sentences):
      batches.append(batch)
      batch, longest_with = [], lengths[i]
    batch.append(i)
    longest = longest_with
  return batches + ([batch] if batch else [])
