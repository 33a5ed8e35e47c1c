"""absl flags for the data, shared by every bin/ script that reads a corpus."""

from absl import flags

from tf_transformer.data import numbers


def define_flags():
  """Defines the data flags (once per process)."""
  flags.DEFINE_string(
      "dataset", "numbers", "'numbers' (embedded, generated), a TFDS "
      "translation dataset such as wmt14_translate/de-en, or empty for local "
      "files (--train_source/--train_target).")
  for split in ("train", "dev", "test"):
    flags.DEFINE_string(f"{split}_source", None,
                        f"Local {split} source text, one sentence per line, "
                        "or a source<TAB>target file when no target is given"
                        + ("; several comma-separated files are several "
                           "corpora (--train_weights)." if split == "train"
                           else "."))
    flags.DEFINE_string(f"{split}_target", None,
                        f"Local {split} target text, line-aligned with "
                        f"--{split}_source.")
  flags.DEFINE_string(
      "train_weights", None, "With several comma-separated --train_source "
      "(and --train_target) files: comma-separated sampling weights, one a "
      "corpus; each batch is drawn from one corpus with these odds "
      "(default: equal), as OpenNMT-tf's train_files_weights.")
  flags.DEFINE_string("source_language", "en", "Source language code.")
  flags.DEFINE_string("target_language", "de", "Target language code.")
  flags.DEFINE_string("data_dir", None, "TFDS data directory.")
  flags.DEFINE_string("tfds_manual_dir", None,
                      "Directory of manually downloaded TFDS archives.")
  flags.DEFINE_integer("numbers_train_size", numbers.DEFAULT_SIZES["train"],
                       "Training pairs of the generated numbers task.")
  flags.DEFINE_integer("max_length", 256, "Longest pair kept, in subword "
                       "tokens (with EOS); longer pairs are dropped and "
                       "counted, never truncated.")


def define_vocabulary_flags():
  """--vocab_size and --vocab_model_type (bin/prepare_data.py and
  bin/train.py, which builds the vocabulary when a run has none)."""
  flags.DEFINE_integer("vocab_size", None, "Shared source-target vocabulary "
                       "size (default: follows the training pairs: 4000 "
                       "below 10k, 8000 below 100k, 16000 below 1M, else the "
                       "paper's 37000); smaller when the corpus cannot fill "
                       "it.")
  flags.DEFINE_enum("vocab_model_type", "bpe", ["bpe", "unigram"],
                    "SentencePiece model type.")


def spec_from_flags(values=None):
  """The flags' `DataSpec`, checked (its files exist, its flags agree)."""
  # TensorFlow Datasets is imported only here, after the flags are parsed.
  from tf_transformer.data.sources import DataSpec  # pylint: disable=g-import-not-at-top
  values = values or flags.FLAGS
  return DataSpec(
      dataset=values.dataset or "",
      train_source=values.train_source, train_target=values.train_target,
      train_weights=values.train_weights,
      dev_source=values.dev_source, dev_target=values.dev_target,
      test_source=values.test_source, test_target=values.test_target,
      source_language=values.source_language,
      target_language=values.target_language, data_dir=values.data_dir,
      manual_dir=values.tfds_manual_dir,
      numbers_train_size=values.numbers_train_size,
      seed=values.seed if "seed" in values else 0).check()
