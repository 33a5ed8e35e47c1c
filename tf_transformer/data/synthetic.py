"""Random sentence pairs of one length: the batch that training speed is
measured on (the precision probe, `benchmarks/benchmark.py --sections=train`,
`benchmarks/gpu_check.py`). numpy only, so that it runs where TensorFlow is not
installed."""

import numpy as np

from tf_transformer.special_ids import BOS_ID
from tf_transformer.special_ids import EOS_ID


def random_pairs(vocab_size, batch_tokens, sequence_length, seed=0):
  """A batch of random full-length pairs, the shape of one length bucket.

  Args:
    vocab_size: pieces are drawn from the ids past the special ones.
    batch_tokens: tokens a side (the paper's 25,000, section 5.1).
    sequence_length: tokens a sentence, source and target, EOS last.
    seed: the draw's seed.
  Returns:
    (source_ids, target_input_ids, labels), int32 numpy arrays [batch
    // sequence_length, sequence_length].
  """
  rng = np.random.default_rng(seed)
  batch = max(1, batch_tokens // sequence_length)
  draw = lambda: rng.integers(4, vocab_size, (batch, sequence_length),
                              dtype=np.int32)
  source, labels = draw(), draw()
  source[:, -1] = labels[:, -1] = EOS_ID
  target_input = np.concatenate(
      [np.full((batch, 1), BOS_ID, np.int32), labels[:, :-1]], axis=1)
  return source, target_input, labels
