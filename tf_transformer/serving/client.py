"""Clients of a running TensorFlow Serving that serves an export of ours.

REST: POST http://HOST:8501/v1/models/NAME[/versions/V]:predict with the
columnar ("inputs") format, answered by {"outputs": {...}} or {"error": ...}.
gRPC: tensorflow.serving.PredictionService/Predict on HOST:8500, with the
`tensorflow-serving-api` package (pip install "tf_transformer[serving]").

Both send raw strings to a signature of `serving/export.py` and return, per
input, a list of (translation, score) pairs: one for `serving_default`, n
for `nbest`.
"""

import json
import urllib.error
import urllib.request

SIGNATURE_OUTPUTS = {"serving_default": ("translation", "score"),
                     "nbest": ("translations", "scores")}


class ServingError(Exception):
  """The server answered with an error, or could not be reached."""


def _outputs_of(signature):
  if signature not in SIGNATURE_OUTPUTS:
    raise ValueError(f"signature {signature!r}: the client reads "
                     f"{sorted(SIGNATURE_OUTPUTS)}")
  return SIGNATURE_OUTPUTS[signature]


def _pairs(texts, scores):
  """Columns as the signature returns them -> [[(text, score), ...]]."""
  if texts and not isinstance(texts[0], list):  # serving_default: [batch]
    texts, scores = [[t] for t in texts], [[s] for s in scores]
  return [[(_text(t), float(s)) for t, s in zip(row, row_scores)]
          for row, row_scores in zip(texts, scores)]


def _text(value):
  return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


# REST.

def rest_url(server, model_name, version=None):
  """`server` is HOST:PORT or a URL (http://HOST:8501)."""
  base = server if "://" in server else f"http://{server}"
  path = f"/v1/models/{model_name}"
  if version is not None:
    path += f"/versions/{version}"
  return base.rstrip("/") + path + ":predict"


def rest_request(texts, signature="serving_default"):
  """The JSON body: columnar inputs, the format that also accepts batches
  with more than one output per input."""
  _outputs_of(signature)
  return {"signature_name": signature, "inputs": {"text": list(texts)}}


def parse_rest_response(body, signature="serving_default"):
  """The decoded JSON answer -> [[(translation, score), ...], ...]."""
  if "error" in body:
    raise ServingError(body["error"])
  text_key, score_key = _outputs_of(signature)
  try:
    outputs = body["outputs"]
    return _pairs(outputs[text_key], outputs[score_key])
  except (KeyError, TypeError) as e:
    raise ServingError(f"unexpected answer (no outputs.{text_key} / "
                       f"outputs.{score_key}): {json.dumps(body)[:200]}") from e


def rest_predict(server, model_name, texts, signature="serving_default",
                 version=None, timeout=60.0):
  request = urllib.request.Request(
      rest_url(server, model_name, version),
      data=json.dumps(rest_request(texts, signature)).encode("utf-8"),
      headers={"Content-Type": "application/json"})
  try:
    with urllib.request.urlopen(request, timeout=timeout) as answer:
      body = json.loads(answer.read().decode("utf-8"))
  except urllib.error.HTTPError as e:  # TF Serving puts the reason in JSON
    try:
      body = json.loads(e.read().decode("utf-8"))
    except ValueError:
      raise ServingError(f"HTTP {e.code}: {e.reason}") from e
  except (urllib.error.URLError, OSError) as e:
    raise ServingError(f"cannot reach {server}: {e}") from e
  return parse_rest_response(body, signature)


# gRPC.

def _serving_api():
  try:
    # pylint: disable=g-import-not-at-top
    from tensorflow_serving.apis import predict_pb2
    from tensorflow_serving.apis import prediction_service_pb2_grpc
  except ImportError as e:
    raise ImportError("gRPC needs tensorflow-serving-api: pip install "
                      "'tf_transformer[serving]'") from e
  return predict_pb2, prediction_service_pb2_grpc


def grpc_request(texts, model_name, signature="serving_default",
                 version=None):
  """A tensorflow.serving.PredictRequest for `texts`."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  _outputs_of(signature)
  predict_pb2, _ = _serving_api()
  request = predict_pb2.PredictRequest()
  request.model_spec.name = model_name
  request.model_spec.signature_name = signature
  if version is not None:
    request.model_spec.version.value = int(version)
  request.inputs["text"].CopyFrom(tf.make_tensor_proto(
      [t.encode("utf-8") for t in texts], dtype=tf.string, shape=[len(texts)]))
  return request


def parse_grpc_response(response, signature="serving_default"):
  """A PredictResponse -> [[(translation, score), ...], ...]."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  text_key, score_key = _outputs_of(signature)
  if text_key not in response.outputs or score_key not in response.outputs:
    raise ServingError(f"unexpected answer: outputs "
                       f"{sorted(response.outputs)}, expected {text_key} "
                       f"and {score_key}")
  texts = tf.make_ndarray(response.outputs[text_key]).tolist()
  scores = tf.make_ndarray(response.outputs[score_key]).tolist()
  return _pairs(texts, scores)


def grpc_predict(server, model_name, texts, signature="serving_default",
                 version=None, timeout=60.0):
  import grpc  # pylint: disable=g-import-not-at-top
  _, service = _serving_api()
  with grpc.insecure_channel(server) as channel:
    stub = service.PredictionServiceStub(channel)
    try:
      response = stub.Predict(
          grpc_request(texts, model_name, signature, version), timeout)
    except grpc.RpcError as e:
      raise ServingError(f"{e.code().name}: {e.details()}") from e
  return parse_grpc_response(response, signature)
