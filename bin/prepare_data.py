#!/usr/bin/env python3
"""Builds the shared SentencePiece vocabulary of a corpus and prints its
statistics: pairs, tokens, length percentiles, pairs dropped and why.

  bin/prepare_data.py --dataset=numbers --vocab_size=8000 --output_dir=/tmp/numbers
  bin/prepare_data.py --dataset=wmt14_translate/de-en --source_language=en \
      --target_language=de --vocab_size=37000 --output_dir=/tmp/wmt_ende
  bin/prepare_data.py --dataset= --train_source=train.en --train_target=train.de \
      --vocab_size=16000 --output_dir=/tmp/mine

Writes OUTPUT_DIR/vocabulary.model and OUTPUT_DIR/data_stats.json.
"""

import json
import os
import sys

from absl import app
from absl import flags

from tf_transformer.data import data_flags
from tf_transformer.data import prepare as prepare_lib
from tf_transformer.data import sources
from tf_transformer.data.errors import DataError

FLAGS = flags.FLAGS
data_flags.define_flags()
flags.DEFINE_string("output_dir", None, "Where vocabulary.model and "
                    "data_stats.json are written (a training --model_dir).")
flags.DEFINE_integer("vocab_size", 37000, "Shared source-target vocabulary "
                     "size (37000 for the paper's English-German); smaller "
                     "when the corpus cannot fill it.")
flags.DEFINE_enum("vocab_model_type", "bpe", ["bpe", "unigram"],
                  "SentencePiece model type.")
flags.DEFINE_integer("vocab_max_sentences", 5_000_000, "Sentences sampled "
                     "to train the vocabulary.")
flags.DEFINE_integer("seed", 0, "Seed of the generated data and sampling.")
flags.mark_flag_as_required("output_dir")


def prepare(spec, output_dir, vocab_size, model_type, max_sentences,
            max_length, seed):
  """Trains and saves the vocabulary; returns the corpus statistics."""
  vocabulary = prepare_lib.build_vocabulary(spec, vocab_size, model_type,
                                            max_sentences, seed)
  vocabulary.save(output_dir)
  stats = prepare_lib.corpus_statistics(spec, vocabulary, max_length)
  with open(os.path.join(output_dir, "data_stats.json"), "w") as f:
    json.dump(stats, f, indent=2)
  return stats


def report(stats):
  print(f"vocab_size={stats['vocab_size']}")
  for split in sources.SPLITS:
    if split not in stats:
      continue
    s = stats[split]
    print(f"{split}: pairs={s['pairs']} source_tokens={s['source_tokens']} "
          f"target_tokens={s['target_tokens']}")
    for side in ("source", "target"):
      percentiles = s.get(f"{side}_length_percentiles", {})
      print(f"  {side} length percentiles: " + " ".join(
          f"p{p}={v}" for p, v in percentiles.items()))
    print(f"  dropped: too_long(>{s['max_length']})={s['dropped_too_long']} "
          f"empty_side={s['dropped_empty_side']}")


def main(argv):
  del argv
  try:
    spec = data_flags.spec_from_flags()
    stats = prepare(spec, FLAGS.output_dir, FLAGS.vocab_size,
                    FLAGS.vocab_model_type, FLAGS.vocab_max_sentences,
                    FLAGS.max_length, FLAGS.seed)
  except DataError as e:
    print(f"prepare_data: error: {e}", file=sys.stderr)
    return 1
  report(stats)
  return 0


if __name__ == "__main__":
  app.run(main)
