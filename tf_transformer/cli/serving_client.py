r"""Translates sentences, one per line from stdin or --input, with a running
TensorFlow Serving that serves an export of bin/export.py.

  bin/serving_client.py --server=localhost:8501 --model_name=numbers < in.txt
  bin/serving_client.py --protocol=grpc --server=localhost:8500 \
      --model_name=numbers --signature=nbest < in.txt

With --target it scores given translations instead, as bin/score.py does:

  bin/serving_client.py --model_name=numbers --input=src.txt \
      --target=hyp.txt --tokens

Each request holds sentences of similar length (the input sorted by its
whitespace words, --batch_words), as translate.py batches, within buffers
of --buffer_lines lines; the lines come out in input order as they are
answered, and typed at a terminal a line is sent as it is entered. REST
needs nothing beyond Python; gRPC needs tensorflow-serving-api (in a clone,
pip install ".[serving]"). Output lines are those of bin/translate.py: the
translation, with --show_scores `SCORE<TAB>TEXT`, for --signature=nbest
`INDEX ||| TEXT ||| SCORE`, and with --alignment `TEXT ||| 0-0 1-2 ...` (the
export's `alignment` signature; the word pairs are made here, as
translate.py makes them). With --target they are bin/score.py's:
`LOG_PROB<TAB>TOKENS`, --tokens adding the per-token values, --alignment
the pair's word alignment (the `score` and `forced_alignment` signatures).

Exit status: 0 answered; 1 bad flags, server or answer; 2 an unreadable
input or --target (the file, or stdin, and the line named), or the two of
different line counts.
"""


from absl import flags

from tf_transformer import command
from tf_transformer.data.corpora import check_line_aligned
from tf_transformer.data.corpora import read_lines
from tf_transformer.data.text_batches import batch_indices, in_input_order
from tf_transformer.data.text_batches import word_lengths
from tf_transformer.data.errors import DataError
from tf_transformer.run import translator_flags
from tf_transformer.serving.output import aligned_lines
from tf_transformer.serving.output import output_lines
from tf_transformer.serving.output import score_lines
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
flags.DEFINE_integer("batch_size", 32, "Sentences per request (at most, "
                     "with --batch_words).", lower_bound=1)
flags.DEFINE_integer("batch_words", 1024, "Sort the input by length and "
                     "cut requests of at most this many whitespace words "
                     "(+1 a sentence for EOS), padding included: the "
                     "client has no tokenizer (Marian's "
                     "--mini-batch-words); outputs stay in input order. "
                     "0: requests of --batch_size in input order.",
                     lower_bound=0)
flags.DEFINE_bool("show_scores", False, "Prefix each translation with its "
                  "score and a tab.")
flags.DEFINE_float("timeout", 60.0, "Seconds to wait for each answer.")
flags.DEFINE_string("target", None, "Translations of the input to score, "
                    "line-aligned with it (the export's score signature, "
                    "or forced_alignment with --alignment): prints "
                    "bin/score.py's lines instead of translations.")
flags.DEFINE_bool("tokens", False, "With --target: add each target token's "
                  "log-probability, as bin/score.py --tokens.")
translator_flags.define_alignment_flags(
    "the export's alignment signature, or forced_alignment with --target")
translator_flags.define_buffer_flag(
    work="sent", terminal=" Stdin is read a buffer at a time, as it "
    "comes; where it is a terminal the default is 1 (a line is sent when "
    "typed).")
flags.mark_flag_as_required("model_name")
flags.register_multi_flags_validator(
    ["alignment", "signature"],
    lambda f: not f["alignment"] or f["signature"] == "serving_default",
    "--alignment: one translation a line (the alignment signature), not "
    "--signature=nbest")
flags.register_multi_flags_validator(
    ["target", "signature", "show_scores"],
    lambda f: not f["target"] or (f["signature"] == "serving_default"
                                  and not f["show_scores"]),
    "--target scores given translations (bin/score.py's lines, the score "
    "first): not with --signature=nbest or --show_scores")
flags.register_multi_flags_validator(
    ["tokens", "target"], lambda f: not f["tokens"] or f["target"],
    "--tokens is read only with --target")


def main(argv):
  del argv
  rest = FLAGS.protocol == "rest"
  server = FLAGS.server or ("localhost:8501" if rest else "localhost:8500")
  try:
    targets = read_lines(FLAGS.target) if FLAGS.target else None
    given = translator_flags.input_buffers(FLAGS.input,
                                           whole=targets is not None)
    if targets is not None:
      check_line_aligned(given.lines, targets, (
          f"--input={FLAGS.input}" if FLAGS.input else "stdin",
          f"--target={FLAGS.target}"))
    if not rest:  # tensors are TensorFlow's protos; after what needs none
      command.import_tensorflow_quietly()
    for first, texts in given.buffers:
      start = first - 1
      sides = [texts] if targets is None else [
          texts, targets[start:start + len(texts)]]
      lengths = lambda: [max(pair) for pair in zip(*map(word_lengths, sides))]
      batches = batch_indices(len(texts), FLAGS.batch_size,
                              FLAGS.batch_words, lengths)
      for lines in in_input_order(  # each input's lines, as soon as in order
          len(texts), batches,
          lambda rows: _request(rest, server, rows, sides, start)):
        command.write_stdout("".join(line + "\n" for line in lines))
  except DataError as e:
    return command.fail("serving_client", e, 2)
  except (OSError, ImportError, ValueError, client.ServingError) as e:
    return command.fail("serving_client", e, 1)
  return 0


def _request(rest, server, rows, sides, start):
  """The answers to one request: each input's output lines.

  Args:
    rest: REST, else gRPC.
    server: its address.
    rows: the inputs sent, indices into `sides`.
    sides: [texts] or [texts, targets] of one buffer of input lines.
    start: the buffer's first input's index in the whole input.
  """
  batch = [sides[0][r] for r in rows]
  if len(sides) == 2:
    score = client.rest_score if rest else client.grpc_score
    return [[line] for line in score_lines(score(
        server, FLAGS.model_name, batch, [sides[1][r] for r in rows],
        FLAGS.alignment, FLAGS.alignment_layer, FLAGS.model_version,
        FLAGS.timeout), FLAGS.tokens)]
  if FLAGS.alignment:
    align = client.rest_align if rest else client.grpc_align
    return [[line] for line in aligned_lines(
        align(server, FLAGS.model_name, batch, FLAGS.alignment_layer,
              FLAGS.model_version, FLAGS.timeout), FLAGS.show_scores)]
  predict = client.rest_predict if rest else client.grpc_predict
  answers = predict(server, FLAGS.model_name, batch, FLAGS.signature,
                    FLAGS.model_version, FLAGS.timeout)
  return [output_lines([hypotheses], FLAGS.signature == "nbest",
                       FLAGS.show_scores, start + row)
          for row, hypotheses in zip(rows, answers)]


def run():
  """`tf-transformer-serving-client`: parses the flags, then runs `main`."""
  command.run(main, tensorflow=False)
