"""Building a run's vocabulary and corpus statistics from a `DataSpec`."""

import itertools

from absl import logging

from tf_transformer.data import batching
from tf_transformer.data import corpora
from tf_transformer.data import errors
from tf_transformer.data import sources
from tf_transformer.data import vocabulary as vocabulary_lib


def build_vocabulary(spec, vocab_size, model_type="bpe",
                     max_sentences=5_000_000, seed=0):
  """Trains the shared vocabulary on both sides of the training pairs."""
  pairs = sources.text_pairs(spec, "train")
  sentences = (side for pair in pairs() for side in pair)
  proto = vocabulary_lib.train(
      itertools.islice(sentences, 2 * max_sentences), vocab_size, model_type,
      max_sentences, seed)
  vocabulary = vocabulary_lib.Vocabulary(proto)
  if vocabulary.vocab_size < vocab_size:
    logging.info("the vocabulary has %d pieces, not --vocab_size=%d: "
                 "SentencePiece found no more pieces to add in this training "
                 "text", vocabulary.vocab_size, vocab_size)
  return vocabulary


@errors.unwrapped()  # read through tf.data, which wraps a DataError
def corpus_statistics(spec, vocabulary, max_length):
  """Per split: pairs, tokens, length percentiles, pairs dropped and why."""
  stats = {"vocab_size": vocabulary.vocab_size}
  for split in sources.SPLITS:
    if not sources.has_split(spec, split):
      continue
    read = corpora.ReadStats()
    tokens = batching.tokenize(
        batching.text_dataset(sources.text_pairs(spec, split, read)),
        vocabulary)
    split_stats = batching.length_statistics(tokens, max_length)
    split_stats["dropped_empty_side"] = sum(read.skipped.values())
    stats[split] = split_stats
  return stats
