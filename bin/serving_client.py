#!/usr/bin/env python3
r"""Translates sentences, one per line from stdin or --input, with a running
TensorFlow Serving that serves an export of bin/export.py.

  bin/serving_client.py --server=localhost:8501 --model_name=numbers < in.txt
  bin/serving_client.py --protocol=grpc --server=localhost:8500 \
      --model_name=numbers --signature=nbest < in.txt

REST needs nothing beyond Python; gRPC needs tensorflow-serving-api
(pip install "tf_transformer[serving]"). Output lines are those of
bin/translate.py: the translation, with --show_scores `SCORE<TAB>TEXT`, for
--signature=nbest `INDEX ||| TEXT ||| SCORE`, and with --alignment
`TEXT ||| 0-0 1-2 ...` (the export's `alignment` signature; the word pairs
are made here, as translate.py makes them).
"""

import sys

from absl import flags

from tf_transformer import command
from tf_transformer.run import translator_flags
from tf_transformer.serving.output import aligned_lines
from tf_transformer.serving.output import output_lines
from tf_transformer.serving import client

FLAGS = flags.FLAGS
flags.DEFINE_enum("protocol", "rest", ["rest", "grpc"], "REST (port 8501) "
                  "or gRPC (port 8500).")
flags.DEFINE_string("server", None, "HOST:PORT (default: localhost:8501 for "
                    "REST, localhost:8500 for gRPC).")
flags.DEFINE_string("model_name", None, "The --model_name the server runs.")
flags.DEFINE_integer("model_version", None, "A version (default: the "
                     "server's newest).")
flags.DEFINE_enum("signature", "serving_default",
                  sorted(client.SIGNATURE_OUTPUTS), "Signature to call.")
flags.DEFINE_string("input", None, "Input file (default: stdin).")
flags.DEFINE_integer("batch_size", 32, "Sentences per request.")
flags.DEFINE_bool("show_scores", False, "Prefix each translation with its "
                  "score and a tab.")
flags.DEFINE_float("timeout", 60.0, "Seconds to wait for each answer.")
translator_flags.define_alignment_flags("the export's alignment signature")
flags.mark_flag_as_required("model_name")
flags.register_multi_flags_validator(
    ["alignment", "signature"],
    lambda f: not f["alignment"] or f["signature"] == "serving_default",
    "--alignment: one translation a line (the alignment signature), not "
    "--signature=nbest")


def main(argv):
  del argv
  rest = FLAGS.protocol == "rest"
  server = FLAGS.server or ("localhost:8501" if rest else "localhost:8500")
  if not rest:  # tensors are TensorFlow's protos
    command.import_tensorflow_quietly()
  try:
    source = open(FLAGS.input, encoding="utf-8") if FLAGS.input else sys.stdin
    with source:
      texts = [line.rstrip("\r\n") for line in source]
    for start in range(0, len(texts), FLAGS.batch_size):
      batch = texts[start:start + FLAGS.batch_size]
      if FLAGS.alignment:
        align = client.rest_align if rest else client.grpc_align
        lines = aligned_lines(
            align(server, FLAGS.model_name, batch, FLAGS.alignment_layer,
                  FLAGS.model_version, FLAGS.timeout), FLAGS.show_scores)
      else:
        predict = client.rest_predict if rest else client.grpc_predict
        lines = output_lines(
            predict(server, FLAGS.model_name, batch, FLAGS.signature,
                    FLAGS.model_version, FLAGS.timeout),
            FLAGS.signature == "nbest", FLAGS.show_scores, start)
      sys.stdout.write("".join(line + "\n" for line in lines))
  except (OSError, ImportError, ValueError, client.ServingError) as e:
    print(f"serving_client: error: {e}", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  command.run(main, tensorflow=False)
