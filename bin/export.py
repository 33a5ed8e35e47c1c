#!/usr/bin/env python3
"""Exports a trained model as a SavedModel for TensorFlow Serving, in the
layout TF Serving watches (EXPORT_DIR/<version>/), or with
--format=ctranslate2 as a CTranslate2 model directory (EXPORT_DIR itself,
replaced if it exists; needs `pip install -e ".[ctranslate2]"`).

  bin/export.py --model_dir=/tmp/numbers_avg --export_dir=saved_models/numbers
  bin/export.py --model_dir=/tmp/numbers_avg --format=ctranslate2 \
      --export_dir=saved_models/numbers_ct2

The search is beam search with the config's beam size, alpha and length
offset unless the decoding flags say otherwise (--decoding=greedy, or
--decoding=sample with --temperature, --top_k, --num_samples).
"""

import sys
import time

from absl import flags
from absl import logging

from tf_transformer import command
from tf_transformer.run import translator_flags
from tf_transformer.run.runner import Runner

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "A training run or an averaged one.")
flags.DEFINE_string("checkpoint", None, "A checkpoint path (default: the "
                    "newest in --model_dir).")
flags.DEFINE_string("export_dir", None, "saved_models/NAME; the version "
                    "folder is added.")
translator_flags.define_decoding_flags()
flags.DEFINE_integer("max_input_tokens", 256, "Longer inputs are cut.")
flags.DEFINE_enum("format", "saved_model", ["saved_model", "ctranslate2"],
                  "saved_model: for TensorFlow Serving; ctranslate2: for the "
                  "CTranslate2 engine (same weights, same search options).")
flags.DEFINE_enum("quantization", None, ["int8", "int8_float32", "int16",
                                         "float16", "bfloat16"],
                  "--format=ctranslate2 only: store the weights in this type "
                  "(default float32; CTranslate2 can still quantize at load).")
flags.DEFINE_integer("decode_parts", 1, "Decode each request as this many "
                     "length-sorted slices at once: one per core, for a "
                     "server run with --tensorflow_intra_op_parallelism=1 "
                     "(docs/serving.md).", lower_bound=1)
flags.DEFINE_bool("xla", False, "Compile the search with XLA (serve with "
                  "--xla_cpu_compilation_enabled on CPU), one program per "
                  "request shape: a power-of-2 batch, a multiple of 16 "
                  "subwords (docs/serving.md).")
flags.mark_flags_as_required(["model_dir", "export_dir"])
flags.register_multi_flags_validator(
    ["xla", "decode_parts"], lambda f: not (f["xla"] and f["decode_parts"] > 1),
    "--xla with --decode_parts > 1: XLA would compile the parts anew for "
    "every request; choose one")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # not SavedModel's info lines
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf.get_logger().setLevel("ERROR")
  start = time.time()
  stage = lambda what: print(f"export: {what} [{time.time() - start:.1f} s]",
                             file=sys.stderr, flush=True)
  try:
    path = Runner(FLAGS.model_dir).export(
        FLAGS.export_dir, FLAGS.checkpoint, FLAGS.format,
        FLAGS.max_input_tokens, FLAGS.xla, FLAGS.decode_parts,
        FLAGS.quantization, on_stage=stage,
        **translator_flags.decoding_overrides())
  except (FileNotFoundError, ImportError, ValueError) as e:
    print(f"export: error: {e}", file=sys.stderr)
    return 1
  print(f"exported {path}")
  return 0


if __name__ == "__main__":
  command.run(main)
