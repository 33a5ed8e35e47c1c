#!/usr/bin/env python3
r"""Translates sentences, one per line from stdin or --input, with a running
TensorFlow Serving that serves an export of bin/export.py.

  bin/serving_client.py --server=localhost:8501 --model_name=numbers < in.txt
  bin/serving_client.py --protocol=grpc --server=localhost:8500 \
      --model_name=numbers --signature=nbest < in.txt

REST needs nothing beyond Python; gRPC needs tensorflow-serving-api
(pip install "tf_transformer[serving]"). Output lines are those of
bin/translate.py: the translation, with --show_scores `SCORE<TAB>TEXT`, and
for --signature=nbest `INDEX ||| TEXT ||| SCORE`.
"""

import sys

from absl import flags

from tf_transformer import command
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
flags.mark_flag_as_required("model_name")


def main(argv):
  del argv
  rest = FLAGS.protocol == "rest"
  server = FLAGS.server or ("localhost:8501" if rest else "localhost:8500")
  predict = client.rest_predict if rest else client.grpc_predict
  if not rest:  # tensors are TensorFlow's protos
    command.import_tensorflow_quietly()
  try:
    source = open(FLAGS.input, encoding="utf-8") if FLAGS.input else sys.stdin
    with source:
      texts = [line.rstrip("\r\n") for line in source]
    for start in range(0, len(texts), FLAGS.batch_size):
      results = predict(server, FLAGS.model_name,
                        texts[start:start + FLAGS.batch_size],
                        FLAGS.signature, FLAGS.model_version, FLAGS.timeout)
      lines = output_lines(results, FLAGS.signature == "nbest",
                           FLAGS.show_scores, start)
      sys.stdout.write("".join(line + "\n" for line in lines))
  except (OSError, ImportError, client.ServingError) as e:
    print(f"serving_client: error: {e}", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  command.run(main, tensorflow=False)
