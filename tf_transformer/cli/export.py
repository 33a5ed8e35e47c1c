"""Exports a trained model as a SavedModel for TensorFlow Serving, in the
layout TF Serving watches (EXPORT_DIR/<version>/), or with
--format=ctranslate2 as a CTranslate2 model directory (EXPORT_DIR itself,
replaced if it exists; needs `pip install -e ".[ctranslate2]"`), or with
--format=transformers as a Transformers MarianMTModel directory (EXPORT_DIR
itself, likewise; needs `pip install -e ".[marian]"`).

  bin/export.py --model_dir=/tmp/numbers_avg --export_dir=saved_models/numbers
  bin/export.py --model_dir=/tmp/numbers_avg --format=ctranslate2 \
      --export_dir=saved_models/numbers_ct2
  bin/export.py --model_dir=/tmp/numbers_avg --format=transformers \
      --export_dir=exports/numbers_hf
  bin/export.py --model_dir=runs/a/averaged --model_dir=runs/b/averaged \
      --export_dir=saved_models/ensemble

Several --model_dir (runs, averaged runs or RUN/ckpt-N checkpoints of one
vocabulary) export one SavedModel whose search averages their
log-probabilities at each step (--ensemble_average), with the same
signatures as a single model's.

The search is beam search with the config's beam size, alpha and length
offset unless the decoding flags say otherwise (--decoding=greedy, or
--decoding=sample with --temperature, --top_k, --top_p, --num_samples),
and bans no token unless --min_length or --no_repeat_ngram_size says so
(docs/decoding.md).
--shortlist=K,N searches over each request's vocabulary shortlist, from the
table bin/build_shortlist.py wrote in the run (docs/serving.md).

A version is written beside the others and renamed into place whole, so TF
Serving never sees half of one. Exit status: 0 exported; 1 refused; 75 the
disk is full (one line; the versions before are as they were).
"""

import os
import sys
import time

from absl import flags
from absl import logging

from tf_transformer import command
from tf_transformer.data.errors import DataError
from tf_transformer.run import export_flags

FLAGS = flags.FLAGS
export_flags.define_flags()


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # not SavedModel's info lines
  # pylint: disable=g-import-not-at-top  (TensorFlow after the flags)
  import tensorflow as tf
  from tf_transformer.run.runner import Runner
  tf.get_logger().setLevel("ERROR")
  start = time.time()
  stage = lambda what: print(f"export: {what} [{time.time() - start:.1f} s]",
                             file=sys.stderr, flush=True)
  try:
    path = Runner(FLAGS.model_dir[0]).export(
        FLAGS.export_dir, on_stage=stage, **export_flags.export_arguments())
  except (FileNotFoundError, ImportError, ValueError, DataError) as e:
    return command.fail("export", e, 1)
  print(f"exported {path} ({command.megabytes(path):,.1f} MB)")
  return 0


def _kept():
  """What a full disk left, (as a sentence, --export_dir): the partial
  write is removed; the versions before, or the CTranslate2 model, stay."""
  directory = FLAGS.export_dir
  if FLAGS.format != "saved_model":
    return f"{directory} is as it was; the partial copy is removed", directory
  from tf_transformer.serving import export as export_lib  # pylint: disable=g-import-not-at-top
  kept = export_lib.versions(directory)
  if not kept:
    return "no version was written; the partial one is removed", directory
  return (f"the newest version, {os.path.join(directory, str(kept[-1]))}, "
          "is as it was; the partial one is removed", directory)


def run():
  """`tf-transformer-export`: parses the flags, then runs `main`."""
  command.run(main, kept=_kept)
