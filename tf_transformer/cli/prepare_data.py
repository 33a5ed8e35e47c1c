r"""Builds the shared SentencePiece vocabulary of a corpus and prints its
statistics: pairs, tokens, length percentiles, pairs dropped and why.

  bin/prepare_data.py --dataset=numbers --vocab_size=8000 --output_dir=/tmp/numbers
  bin/prepare_data.py --dataset=wmt14_translate/de-en --source_language=en \
      --target_language=de --vocab_size=37000 --output_dir=/tmp/wmt_ende
  bin/prepare_data.py --dataset= --train_source=train.en --train_target=train.de \
      --vocab_size=16000 --output_dir=/tmp/mine

Writes OUTPUT_DIR/vocabulary.model and OUTPUT_DIR/data_stats.json, and with
--write_text=dev,test each split's raw pairs as OUTPUT_DIR/dev.en, dev.de, ...
Bad data gives one line naming the file and line, and exit status 2.
"""


from absl import flags

from tf_transformer import command
from tf_transformer.choices import SPLITS
from tf_transformer.data import data_flags
from tf_transformer.data.errors import DataError

FLAGS = flags.FLAGS
data_flags.define_flags()
flags.DEFINE_string("output_dir", None, "Where vocabulary.model and "
                    "data_stats.json are written (a training --model_dir).")
data_flags.define_vocabulary_flags()
flags.DEFINE_integer("vocab_max_sentences", 5_000_000, "Sentences sampled "
                     "to train the vocabulary.")
flags.DEFINE_integer("seed", 0, "Seed of the generated data and sampling.")
flags.DEFINE_list("write_text", [], "Splits (dev, test, train) whose raw "
                  "pairs to write as OUTPUT_DIR/SPLIT.SRC and SPLIT.TGT "
                  "(language codes), line-aligned, for bin/evaluate.py.")
flags.mark_flag_as_required("output_dir")
flags.register_validator(
    "write_text", lambda splits: set(splits) <= set(SPLITS),
    f"--write_text: each must be one of {', '.join(SPLITS)}")


def main(argv):
  del argv
  # pylint: disable=g-import-not-at-top  (TensorFlow after the flags)
  from tf_transformer.data import prepare as prepare_lib
  from tf_transformer.run.runner import Runner
  try:
    prepared = Runner(FLAGS.output_dir).prepare(
        data_flags.spec_from_flags(), FLAGS.vocab_size,
        FLAGS.vocab_model_type, FLAGS.vocab_max_sentences, FLAGS.max_length,
        FLAGS.seed, FLAGS.write_text)
  except DataError as e:
    return command.fail("prepare_data", e, 2)
  print("\n".join(prepare_lib.describe_statistics(prepared.stats)))
  for path in prepared.written:
    print(f"wrote {path}")
  return 0


def run():
  """`tf-transformer-prepare-data`: parses the flags, then runs `main`."""
  command.run(main)
