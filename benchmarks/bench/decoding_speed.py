"""Decoding speed of exported SavedModels: sentences/s and output tokens/s,
the time per output token as outputs grow, and the cost of wider beams.

The model has random weights (a benchmark must not need a trained model), so
it almost never emits EOS: every output runs to its length limit, source
length + `max_decode_length_offset`. Choosing the sources' length and the
offset therefore fixes the output length, and the work per output token is
that of a trained model producing outputs of that length. Sources are
sentences of whole-word pieces of a synthetic vocabulary of the asked size,
so each word is one subword.
"""

import math
import os
import random
import statistics
import time

import tensorflow as tf

from tf_transformer.stopwatch import median_seconds
from tf_transformer.data import sequences
from tf_transformer.data import vocabulary as vocabulary_lib
from tf_transformer.decoding.search import DecodingOptions
from tf_transformer.decoding.cache import BLOCK_LENGTH
from tf_transformer.serving.translation_module import TranslationModule
from tf_transformer.serving import export as export_lib
from tf_transformer.special_ids import PAD_ID

_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def synthetic_vocabulary(vocab_size, seed=0):
  """A SentencePiece vocabulary of `vocab_size` pieces, most of them whole
  pseudo-words, trained on generated text."""
  rng = random.Random(seed)
  words = sorted({"".join(rng.choice(_LETTERS) for _ in range(rng.randint(
      3, 8))) for _ in range(2 * vocab_size)})
  sentences = [" ".join(rng.choice(words) for _ in range(10))
               for _ in range(20 * vocab_size // 10)]
  return vocabulary_lib.Vocabulary(vocabulary_lib.train(sentences,
                                                        vocab_size))


def whole_words(vocabulary):
  """The pieces that are a whole word (start with U+2581 and at least two
  letters), without the U+2581."""
  ids = tf.range(vocabulary.vocab_size)
  pieces = [p.decode() for p in vocabulary.pieces(ids).numpy()]
  return [p[1:] for p in pieces
          if p.startswith("\u2581") and len(p) > 2 and p[1:].isalpha()]


def sentences(vocabulary, count, words_per_sentence, seed=0):
  rng = random.Random(seed)
  words = whole_words(vocabulary)
  return [" ".join(rng.choice(words) for _ in range(words_per_sentence))
          for _ in range(count)]


def export_model(model, vocabulary, options, directory):
  """Exports `model` as bin/export.py does (no XLA) under `directory`, which
  the caller owns and removes; returns the export's path."""
  module = TranslationModule(model, vocabulary, options)
  return export_lib.export(module, os.path.join(directory, "model"))


def _batches(texts, batch_size):
  return [tf.constant(texts[i:i + batch_size])
          for i in range(0, len(texts), batch_size)]


def output_tokens(signatures, vocabulary, texts):
  """Output subwords (EOS included) the export gives `texts`, counted once
  through its `ids` signature."""
  total = 0
  for start in range(0, len(texts), 256):
    ids = signatures["ids"](source_ids=sequences.source_ids(
        vocabulary, tf.constant(texts[start:start + 256])).to_tensor())[
            "target_ids"]
    total += int(tf.reduce_sum(tf.cast(ids != PAD_ID, tf.int32)))
  return total


def load_export(path):
  """The SavedModel at `path`, loaded once for every batch size measured."""
  import tensorflow_text  # noqa: F401  pylint: disable=unused-import,g-import-not-at-top
  return tf.saved_model.load(path)


def measure_saved_model(loaded, vocabulary, texts, batch_size, runs=3,
                        warmup=1):
  """Sentences/s and output tokens/s of `serving_default` (text in, text
  out, tokenization included) of `loaded` (`load_export`) over `texts` in
  batches."""
  serve = loaded.signatures["serving_default"]
  batches = _batches(texts, batch_size)

  def translate_all():
    for batch in batches:
      serve(text=batch)["translation"].numpy()

  seconds = median_seconds(translate_all, runs, warmup)
  tokens = output_tokens(loaded.signatures, vocabulary, texts)
  return {"batch_size": batch_size, "sentences": len(texts),
          "seconds": seconds, "sentences_per_sec": len(texts) / seconds,
          "output_tokens_per_sec": tokens / seconds,
          "output_tokens_per_sentence": tokens / len(texts)}


def time_per_token(model, vocabulary, output_lengths=(10, 50, 100),
                   beam_size=4, batch_sizes=(32,), runs=3):
  """{"batch_B": {"step_n": seconds}}: seconds per output token around each
  output length n, for each batch size B: (T(n) - T(n / 2)) / (n / 2),
  with T the time to translate one batch whose outputs all have that
  length. With the cache a step's cost grows only by attention's read of
  the positions decoded so far (`decoding/cache.py`). Measured on the
  export's graph code in-process (one module per length, traced once for
  every batch size; exporting each would only add saving time).

  T(n / 2) and T(n) are timed in pairs, one right after the other, and the
  median of the pairs' differences is reported, so that a slow spell of a
  shared machine falls on both sides of a difference. A short output's
  difference is divided by few tokens, so it gets proportionally more
  pairs: `runs` for the longest output, `runs * longest / n` for length n.
  """
  words = 1  # sources of 1 word + EOS = 2 tokens: outputs from 3 tokens
  modules, warm = {}, set()

  def translate(length, batch):
    if length not in modules:
      modules[length] = TranslationModule(model, vocabulary, DecodingOptions(
          beam_size=beam_size,
          max_decode_length_offset=length - (words + 1)))
    run = lambda: modules[length].serve(batch)["translation"].numpy()
    if (length, batch.ref()) not in warm:
      run()  # tracing (a module's first batch), not timed
      warm.add((length, batch.ref()))
    start = time.perf_counter()
    run()
    return time.perf_counter() - start

  longest = max(output_lengths)
  by_batch = {}
  for batch_size in batch_sizes:
    batch = tf.constant(sentences(vocabulary, batch_size, words, seed=1))
    figures = {}
    for n in output_lengths:
      differences = [
          (translate(n, batch) - translate(n // 2, batch)) / (n - n // 2)
          for _ in range(math.ceil(runs * longest / n))]
      figures[f"step_{n}"] = statistics.median(differences)
    by_batch[f"batch_{batch_size}"] = figures
  return by_batch


def cache_bytes_per_position(config, rows, part="both", bytes_per_number=4):
  """Bytes of self-attention keys and/or values (`part`: "key", "value" or
  "both"; section 3.2.3) that one decoded position adds to the cache of
  every decoder layer, for `rows` hypotheses (batch * beam)."""
  c = config.model
  depth = {"key": c.d_k, "value": c.d_v, "both": c.d_k + c.d_v}[part]
  return c.num_layers * c.num_heads * depth * bytes_per_number * rows


def cache_read_per_token(config, rows, output_lengths, key_gb_per_sec,
                         value_gb_per_sec=None, bytes_per_number=4):
  """Seconds per output token that reading the cache (`bytes_per_number`
  per key or value component: 4 for fp32) takes, keys at `key_gb_per_sec`
  and values at `value_gb_per_sec` (the same unless given), over the same
  steps as `time_per_token` around each n (n / 2 .. n - 1), step t reading
  the whole blocks that hold positions 0..t: the part of the time per token
  that must grow with n unless the cache is read faster."""
  value_gb_per_sec = value_gb_per_sec or key_gb_per_sec
  seconds_per_position = (
      cache_bytes_per_position(config, rows, "key", bytes_per_number)
      / key_gb_per_sec
      + cache_bytes_per_position(config, rows, "value", bytes_per_number)
      / value_gb_per_sec
  ) / 1e9
  figures = {}
  for n in output_lengths:
    steps = range(n // 2, n)
    positions = sum(-(-(t + 1) // BLOCK_LENGTH) * BLOCK_LENGTH
                    for t in steps) / len(steps)
    figures[f"step_{n}"] = seconds_per_position * positions
  return figures


def beam_scaling(model, vocabulary, texts, beam_sizes=(1, 4, 8),
                 batch_size=32, max_length_offset=1, runs=3):
  """Sentences/s against the beam size, same graph code in-process."""
  batches = _batches(texts, batch_size)
  results = {}
  for k in beam_sizes:
    module = TranslationModule(model, vocabulary, DecodingOptions(
        beam_size=k, max_decode_length_offset=max_length_offset))

    def translate_all(module=module):
      for batch in batches:
        module.serve(batch)["translation"].numpy()
    results[f"beam_{k}"] = len(texts) / median_seconds(translate_all, runs,
                                                        warmup=1)
  return results


def random_shortlist(vocab_size, k=20, n=300, seed=0):
  """A `shortlist.Shortlist` of random candidates (k a piece) and the n
  lowest non-special ids as the frequent ones: for a random-weights model,
  where a table counted on text would mean nothing."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from tf_transformer.decoding.shortlist import Shortlist  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  return Shortlist(
      rng.integers(4, vocab_size, size=[vocab_size, k]).astype(np.int32),
      np.arange(4, min(4 + n, vocab_size), dtype=np.int32))


def shortlist_gain(model, vocabulary, texts, shortlist, batch_size=32,
                   beam_size=4, max_length_offset=10, runs=3):
  """Sentences/s of the whole vocabulary and of `shortlist`, same graph
  code in-process, timed in alternation (one pass each, `runs` times), and
  the shortlist's mean size a batch."""
  from tf_transformer.decoding import shortlist as shortlist_lib  # pylint: disable=g-import-not-at-top
  options = DecodingOptions(beam_size=beam_size,
                            max_decode_length_offset=max_length_offset)
  batches = _batches(texts, batch_size)
  modules = {"full": TranslationModule(model, vocabulary, options),
             "shortlist": TranslationModule(model, vocabulary, options,
                                            shortlist=shortlist)}

  def translate_all(module):
    for batch in batches:
      module.serve(batch)["translation"].numpy()

  seconds = {name: [] for name in modules}
  for module in modules.values():
    translate_all(module)  # tracing and warm-up, not timed
  for _ in range(runs):
    for name, module in modules.items():
      start = time.perf_counter()
      translate_all(module)
      seconds[name].append(time.perf_counter() - start)
  sizes = [int(tf.size(shortlist_lib.vocabulary(
      shortlist, modules["full"].source_ids(batch)["source_ids"])))
           for batch in batches]
  rates = {name: len(texts) / statistics.median(s)
           for name, s in seconds.items()}
  return {"vocab_size": vocabulary.vocab_size,
          "full_sentences_per_sec": rates["full"],
          "shortlist_sentences_per_sec": rates["shortlist"],
          "speedup": rates["shortlist"] / rates["full"],
          "shortlist_pieces": statistics.mean(sizes)}
