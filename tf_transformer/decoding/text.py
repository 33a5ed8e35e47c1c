"""Text in, text out around a decoding function, in batches (eager)."""

import tensorflow as tf

from tf_transformer.data import sequences
from tf_transformer.data.text_batches import in_input_order, length_batches


def translate(decode_fn, vocabulary, texts, batch_tokens=4096,
              max_batch_size=256, source_eos=True):
  """Decodes texts in batches of similar length, so that little of a
  batch is padding and a dev set costs a few batches.

  Args:
    decode_fn: source_ids [batch, length] -> output ids [batch, length'].
    vocabulary: the run's `Vocabulary` (tokenizes and detokenizes).
    texts: source strings.
    batch_tokens, max_batch_size: each batch's budget (`length_batches`).
    source_eos: end each source with EOS (`ModelConfig.source_eos`).
  Returns:
    The detokenized outputs, in the order of `texts`.
  """
  if not texts:
    return []
  ids = sequences.source_ids(vocabulary, tf.constant(texts), eos=source_eos)
  def run(rows):
    decoded = decode_fn(tf.gather(ids, rows).to_tensor())
    return [text.decode("utf-8")
            for text in vocabulary.detokenize(decoded).numpy()]
  return list(in_input_order(len(texts), length_batches(
      ids.row_lengths().numpy(), batch_tokens, max_batch_size), run))
