"""bin/serving_client.py and tf_transformer.serving.client: requests are
built and answers parsed as TF Serving's REST and gRPC APIs define them.

The real tensorflow_model_server cannot be installed here, so the end-to-end
tests run the client against small stand-ins that follow TF Serving's
documented interface (REST: POST /v1/models/NAME[/versions/V]:predict with
columnar "inputs", answer {"outputs": ...} or {"error": ...}; gRPC:
tensorflow.serving.PredictionService/Predict) and answer from our exported
SavedModel itself.
"""

import http.server
import json
import re
import threading
from concurrent import futures

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import prediction_service_pb2_grpc

from tf_transformer.serving import client
from tf_transformer.serving.output import score_line
from tf_transformer.translators.scorer import Scorer
from tf_transformer.translators.translator import Translator
from conftest import UNTRAINED_EXPORT_OFFSET, load_saved_model, run_script
import rounding
import search_reference

TEXTS = ["four hundred and twenty-one", "seven", ""]
# Every request the REST stand-in answers: (signature, its inputs).
REQUESTS = []


@pytest.fixture(scope="module")
def saved_model(untrained_export):
  """The export, loaded; its directory as `.path`."""
  _, exported = untrained_export
  loaded = load_saved_model(exported)
  loaded.path = str(exported)
  return loaded


def _expected(saved_model, signature, texts):
  out = saved_model.signatures[signature](text=tf.constant(texts))
  keys = client.SIGNATURE_OUTPUTS[signature]
  return client._pairs(out[keys[0]].numpy().tolist(),  # pylint: disable=protected-access
                       out[keys[1]].numpy().tolist())


class _RestHandler(http.server.BaseHTTPRequestHandler):
  saved_model = None
  PATH = re.compile(r"^/v1/models/([^/:]+)(?:/versions/(\d+))?:predict$")

  def do_POST(self):  # pylint: disable=invalid-name
    match = self.PATH.match(self.path)
    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
    if not match or match.group(1) != "numbers":
      return self._answer(404, {"error": "Servable not found for request: "
                                         f"Latest({self.path})"})
    REQUESTS.append((body["signature_name"], body["inputs"]))
    signature = self.saved_model.signatures[body["signature_name"]]
    out = signature(**{name: tf.constant(strings, tf.string)
                       for name, strings in body["inputs"].items()})
    outputs = {key: [_json(v) for v in value.numpy().tolist()]
               for key, value in out.items()}
    return self._answer(200, {"outputs": outputs})

  def _answer(self, code, body):
    data = json.dumps(body).encode()
    self.send_response(code)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    self.wfile.write(data)

  def log_message(self, *args):
    del args


def _json(value):
  if isinstance(value, list):
    return [_json(v) for v in value]
  return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


class _Predictor(prediction_service_pb2_grpc.PredictionServiceServicer):

  def __init__(self, saved_model):
    self.saved_model = saved_model

  def Predict(self, request, context):  # pylint: disable=invalid-name
    if request.model_spec.name != "numbers":
      context.abort(grpc.StatusCode.NOT_FOUND, "Servable not found for "
                    f"request: Latest({request.model_spec.name})")
    signature = self.saved_model.signatures[request.model_spec.signature_name]
    out = signature(**{name: tf.constant(tf.make_ndarray(tensor))
                       for name, tensor in request.inputs.items()})
    response = predict_pb2.PredictResponse()
    for key, value in out.items():
      response.outputs[key].CopyFrom(tf.make_tensor_proto(value.numpy()))
    return response


@pytest.fixture(scope="module")
def rest_server(saved_model):
  handler = type("Handler", (_RestHandler,), {"saved_model": saved_model})
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  yield f"127.0.0.1:{server.server_address[1]}"
  server.shutdown()


@pytest.fixture(scope="module")
def grpc_server(saved_model):
  server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
  prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
      _Predictor(saved_model), server)
  port = server.add_insecure_port("127.0.0.1:0")
  server.start()
  yield f"127.0.0.1:{port}"
  server.stop(None)


def test_rest_request_and_url():
  assert client.rest_url("localhost:8501", "numbers") == (
      "http://localhost:8501/v1/models/numbers:predict")
  assert client.rest_url("http://h:1/", "m", version=3) == (
      "http://h:1/v1/models/m/versions/3:predict")
  assert client.rest_request(["a", "b"], "nbest") == {
      "signature_name": "nbest", "inputs": {"text": ["a", "b"]}}
  with pytest.raises(ValueError, match="attention"):
    client.rest_request(["a"], "attention")
  assert client.rest_request(["a"], "score", ["b"]) == {
      "signature_name": "score", "inputs": {"source": ["a"], "target": ["b"]}}
  with pytest.raises(ValueError, match="got 2 sources and 1 targets"):
    client.rest_request(["a", "b"], "forced_alignment", ["c"])
  with pytest.raises(ValueError, match="got 1 sources and no targets"):
    client.rest_request(["a"], "score")
  with pytest.raises(ValueError, match="'nbest' takes no targets"):
    client.rest_request(["a"], "nbest", ["b"])


def test_rest_answers_are_parsed():
  assert client.parse_rest_response(
      {"outputs": {"translation": ["sieben", ""], "score": [-0.5, -1.0]}}) == [
          [("sieben", -0.5)], [("", -1.0)]]
  assert client.parse_rest_response(
      {"outputs": {"translations": [["a", "b"]], "scores": [[-1, -2]]}},
      "nbest") == [[("a", -1.0), ("b", -2.0)]]
  assert client.parse_rest_response(
      {"outputs": {"translation": [], "score": []}}) == []
  with pytest.raises(client.ServingError, match="Servable not found"):
    client.parse_rest_response({"error": "Servable not found"})
  with pytest.raises(client.ServingError, match="outputs.translation"):
    client.parse_rest_response({"predictions": []})


def test_grpc_request_and_answer_round_trip():
  request = client.grpc_request(["sieben", "zwölf"], "numbers", "nbest", 2)
  assert request.model_spec.name == "numbers"
  assert request.model_spec.signature_name == "nbest"
  assert request.model_spec.version.value == 2
  text = request.inputs["text"]
  assert text.dtype == tf.string.as_datatype_enum
  assert [d.size for d in text.tensor_shape.dim] == [2]
  assert [s.decode() for s in text.string_val] == ["sieben", "zwölf"]
  response = predict_pb2.PredictResponse()
  response.outputs["translations"].CopyFrom(tf.make_tensor_proto(
      [["sieben".encode(), "zwölf".encode()]]))
  response.outputs["scores"].CopyFrom(tf.make_tensor_proto([[-0.25, -3.0]]))
  assert client.parse_grpc_response(response, "nbest") == [
      [("sieben", -0.25), ("zwölf", -3.0)]]
  with pytest.raises(client.ServingError, match="expected translation"):
    client.parse_grpc_response(response)
  pairs = client.grpc_request(["a b"], "numbers", "score", targets=["c"])
  assert {name: [v.decode() for v in tensor.string_val]
          for name, tensor in pairs.inputs.items()} == {"source": ["a b"],
                                                        "target": ["c"]}


def test_score_answers_are_parsed():
  """Rows cut to each pair's length; an answer without the outputs a
  signature gives names them."""
  answer = {"log_prob": [-1.5, -0.25], "lengths": [2, 1],
            "token_log_probs": [[-1.0, -0.5, 0.0], [-0.25, 0.0, 0.0]]}
  assert client.scored(answer) == [(-1.5, [-1.0, -0.5]), (-0.25, [-0.25])]
  with pytest.raises(client.ServingError, match="from the forced_alignment "
                     "signature: no source_tokens, target_tokens, "
                     "cross_attention"):
    client.scored(answer, alignment=True)
  with pytest.raises(client.ServingError, match="score signature: no lengths"):
    client.scored({"log_prob": [], "token_log_probs": []})


@pytest.mark.parametrize("signature", ["serving_default", "nbest"])
def test_rest_and_grpc_translate_like_the_saved_model(
    saved_model, rest_server, grpc_server, signature):
  expected = _expected(saved_model, signature, TEXTS)
  assert len(expected) == 3
  assert client.rest_predict(rest_server, "numbers", TEXTS,
                             signature) == expected
  assert client.grpc_predict(grpc_server, "numbers", TEXTS,
                             signature) == expected


@pytest.mark.numeric
def test_rest_and_grpc_align_as_the_saved_model(saved_model, rest_server,
                                                grpc_server,
                                                untrained_export):
  """The alignment signature over either protocol, its word pairs made in
  the client, as translate.py --alignment makes them from the export."""
  texts = TEXTS[:2]
  expected = Translator.from_saved_model(
      saved_model.path).translate_aligned(texts, layer=1)
  # The translator's batches may be other shapes than the servers' (one
  # request): the same lines but where the search met a decision within
  # float32 rounding (tests/search_reference.py), the scores within both
  # searches' float32 bounds (rounding.py).
  from test_export import _searched  # pylint: disable=g-import-not-at-top
  model, sources, outputs = _searched(untrained_export[0], saved_model,
                                      texts)
  bound = 2 * rounding.output_bounds(model, sources, outputs)
  offset = UNTRAINED_EXPORT_OFFSET
  for align, server in ((client.rest_align, rest_server),
                        (client.grpc_align, grpc_server)):
    got = align(server, "numbers", texts, layer=1)
    apart = [line for line, (a, b) in enumerate(zip(got, expected))
             if a[0] != b[0]]
    search_reference.assert_near_ties(model, sources, apart,
                                      max_length_offset=offset)
    same = [line not in apart for line in range(len(texts))]
    assert [(t, p) for (t, _, p), keep in zip(got, same) if keep] == [
        (t, p) for (t, _, p), keep in zip(expected, same) if keep]
    rounding.assert_within(np.array([s for _, s, _ in got])[same],
                           np.array([s for _, s, _ in expected])[same],
                           bound[same])
    with pytest.raises(ValueError, match=r"--alignment_layer=3: the model's "
                       r"decoder has layers 1 to 2"):
      align(server, "numbers", texts, layer=3)
  with pytest.raises(client.ServingError, match="no cross_attention"):
    client.aligned({"translation": [], "score": [], "source_tokens": [],
                    "target_tokens": []})


def test_rest_and_grpc_score_as_the_saved_model(saved_model, rest_server,
                                                grpc_server):
  """The score and forced_alignment signatures over either protocol give
  what bin/score.py gives from the export (`Scorer`), the word pairs made
  in the client."""
  sources, targets = TEXTS, ["vier hundert", "", "sieben"]
  for alignment in (False, True):
    expected = Scorer.from_export(saved_model.path, alignment,
                                  1 if alignment else None).score(
                                      sources, targets)
    # The subwords and the EOS: the empty target scores its EOS alone.
    assert [min(len(row[1]), 2) for row in expected] == [2, 1, 2]
    for score, server in ((client.rest_score, rest_server),
                          (client.grpc_score, grpc_server)):
      got = score(server, "numbers", sources, targets, alignment,
                  1 if alignment else None)
      assert got == expected, (score.__name__, alignment)
  with pytest.raises(ValueError, match=r"--alignment_layer=3"):
    client.rest_score(rest_server, "numbers", sources, targets, True, 3)


@pytest.mark.slow
def test_command_over_rest_and_grpc(saved_model, rest_server, grpc_server):
  stdin = "".join(t + "\n" for t in TEXTS)
  # The expected lines come from the batches the command sends: a
  # sentence's score may differ in its last bits with the batch it is summed
  # in, and a 4-decimal rounding can show that.
  batch = 2
  expected = [pair for start in range(0, len(TEXTS), batch) for pair in
              _expected(saved_model, "serving_default",
                        TEXTS[start:start + batch])]
  lines = [f"{s:.4f}\t{' '.join(t.splitlines())}" for (t, s), in expected]
  for protocol, server in (("rest", rest_server), ("grpc", grpc_server)):
    result = run_script("serving_client.py", f"--protocol={protocol}",
                        f"--server={server}", "--model_name=numbers",
                        "--show_scores", f"--batch_size={batch}",
                        input_text=stdin)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines() == lines
  nbest = run_script("serving_client.py", f"--server={rest_server}",
                     "--model_name=numbers", "--signature=nbest",
                     input_text="seven\n")
  assert [line.split(" ||| ")[0] for line in nbest.stdout.splitlines()] == [
      "0"] * 4
  aligned = run_script("serving_client.py", f"--server={rest_server}",
                       "--model_name=numbers", "--alignment",
                       input_text=stdin)
  assert aligned.returncode == 0, aligned.stderr[-2000:]
  want = Translator.from_saved_model(saved_model.path).translate_aligned(
      TEXTS, batch_size=32)
  assert aligned.stdout.splitlines() == [
      f"{' '.join(t.splitlines())} ||| {p}" for t, _, p in want]


def test_command_sends_sentences_of_similar_length(saved_model,
                                                   rest_server):
  """Requests cut from the input sorted by length (whitespace words),
  longest first, within --buffer_lines buffers; the lines in input order,
  n-best indices too; and with --batch_words=0 the file in order."""
  texts = ["seven", "four hundred and twenty-one", "", "nine hundred and two",
           "one"]
  stdin = "".join(t + "\n" for t in texts)
  sorted_batches = [[1, 3], [0, 4], [2]]
  for batch_words, buffer_lines, batches in (
      (1024, 10_000, sorted_batches), (0, 10_000, [[0, 1], [2, 3], [4]]),
      (1024, 2, [[1, 0], [3, 2], [4]])):  # sorted within buffers of 2
    REQUESTS.clear()
    result = run_script("serving_client.py", f"--server={rest_server}",
                        "--model_name=numbers", "--show_scores",
                        "--batch_size=2", f"--batch_words={batch_words}",
                        f"--buffer_lines={buffer_lines}", input_text=stdin)
    assert result.returncode == 0, result.stderr[-2000:]
    assert [inputs["text"] for _, inputs in REQUESTS] == [
        [texts[i] for i in batch] for batch in batches]
    expected = [None] * len(texts)
    for batch in batches:
      for row, ((text, score),) in zip(batch, _expected(
          saved_model, "serving_default", [texts[i] for i in batch])):
        expected[row] = f"{score:.4f}\t{' '.join(text.splitlines())}"
    assert result.stdout.splitlines() == expected
  # A budget of 6 words: the two 5-word sentences go one a request.
  REQUESTS.clear()
  nbest = run_script("serving_client.py", f"--server={rest_server}",
                     "--model_name=numbers", "--signature=nbest",
                     "--batch_words=6", input_text=stdin)
  assert nbest.returncode == 0, nbest.stderr[-2000:]
  assert [len(inputs["text"]) for _, inputs in REQUESTS] == [1, 1, 3]
  indices = [int(line.split(" ||| ")[0]) for line in nbest.stdout.splitlines()]
  assert indices == sorted(indices) and set(indices) == set(range(5))
  # In buffers of 2 lines, the indices still count from the input's start.
  buffered = run_script("serving_client.py", f"--server={rest_server}",
                        "--model_name=numbers", "--signature=nbest",
                        "--buffer_lines=2", input_text=stdin)
  assert buffered.returncode == 0, buffered.stderr[-2000:]
  assert [int(line.split(" ||| ")[0])
          for line in buffered.stdout.splitlines()] == indices


@pytest.mark.slow
def test_command_scores_as_bin_score(saved_model, rest_server, grpc_server,
                                     tmp_path):
  """--target prints bin/score.py's lines: the log-probability and the
  token count, --tokens the per-token values, --alignment the word pairs
  (forced_alignment), over REST and gRPC."""
  target = tmp_path / "target.txt"
  target.write_text("vier hundert\n\nsieben\n")
  stdin = "".join(t + "\n" for t in TEXTS)
  results = Scorer.from_export(saved_model.path, alignment=True).score(
      TEXTS, target.read_text().splitlines(), batch_size=2)
  for protocol, server in (("rest", rest_server), ("grpc", grpc_server)):
    result = run_script("serving_client.py", f"--protocol={protocol}",
                        f"--server={server}", "--model_name=numbers",
                        f"--target={target}", "--tokens", "--alignment",
                        "--batch_size=2", input_text=stdin)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines() == [
        score_line(r[0], r[1], True, r[2]) for r in results]
  fields = result.stdout.splitlines()[0].split("\t")
  assert len(fields) == 4 and int(fields[1]) == len(fields[2].split()) > 1


def test_command_errors_name_the_problem(rest_server, grpc_server):
  for protocol, server in (("rest", rest_server), ("grpc", grpc_server)):
    result = run_script("serving_client.py", f"--protocol={protocol}",
                        f"--server={server}", "--model_name=nope",
                        input_text="seven\n")
    assert result.returncode == 1
    assert "Servable not found" in result.stderr, result.stderr[-1000:]
    assert "Traceback" not in result.stderr
  closed = run_script("serving_client.py", "--server=127.0.0.1:9",
                      "--model_name=numbers", input_text="seven\n")
  assert closed.returncode == 1 and "cannot reach 127.0.0.1:9" in closed.stderr
