#!/usr/bin/env python3
"""Exports a trained model as a SavedModel for TensorFlow Serving, in the
layout TF Serving watches (EXPORT_DIR/<version>/).

  bin/export.py --model_dir=/tmp/numbers_avg --export_dir=saved_models/numbers
"""

import sys

from absl import app
from absl import flags

from tf_transformer.serving import export as export_lib
from tf_transformer.training import run_dir

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "A training run or an averaged one.")
flags.DEFINE_string("checkpoint", None, "A checkpoint path (default: the "
                    "newest in --model_dir).")
flags.DEFINE_string("export_dir", None, "saved_models/NAME; the version "
                    "folder is added.")
flags.DEFINE_integer("beam_size", None, "Beam size (default: the config's, 4).")
flags.DEFINE_float("alpha", None, "Length penalty alpha (default: 0.6).")
flags.DEFINE_integer("max_length_offset", None, "Output tokens allowed beyond "
                     "the input length (default: 50).")
flags.DEFINE_integer("max_input_tokens", 256, "Longer inputs are cut.")
flags.DEFINE_bool("xla", False, "Compile the search with XLA (serve with "
                  "--xla_cpu_compilation_enabled on CPU).")
flags.mark_flags_as_required(["model_dir", "export_dir"])


def main(argv):
  del argv
  try:
    model, vocabulary = run_dir.load_trained_model(FLAGS.model_dir,
                                                   FLAGS.checkpoint)
    config = model.config
  except FileNotFoundError as e:
    print(f"export: error: {e}", file=sys.stderr)
    return 1
  module = export_lib.TranslationModule(
      model, vocabulary,
      beam_size=FLAGS.beam_size or config.beam_size,
      alpha=config.length_penalty_alpha if FLAGS.alpha is None else FLAGS.alpha,
      max_length_offset=(config.max_decode_length_offset
                         if FLAGS.max_length_offset is None
                         else FLAGS.max_length_offset),
      max_input_tokens=FLAGS.max_input_tokens, xla=FLAGS.xla)
  path = export_lib.export(module, FLAGS.export_dir)
  print(f"exported {path}")
  return 0


if __name__ == "__main__":
  app.run(main)
