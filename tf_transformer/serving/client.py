"""Clients of a running TensorFlow Serving that serves an export of ours.

REST: POST http://HOST:8501/v1/models/NAME[/versions/V]:predict with the
columnar ("inputs") format, answered by {"outputs": {...}} or {"error": ...}.
gRPC: tensorflow.serving.PredictionService/Predict on HOST:8500, with the
`tensorflow-serving-api` package (`pip install ".[serving]"` in a clone).

Both send raw strings to a signature of `serving/export.py` and return, per
input, a list of (translation, score) pairs: one for `serving_default`, n
for `nbest`; or, from the `alignment` signature (`rest_align`,
`grpc_align`), (translation, score, word alignment) triples, the alignment
made here, as bin/translate.py --alignment makes it
(`decoding/alignment.py`). `rest_score` and `grpc_score` send source and
target pairs to the `score` signature (or `forced_alignment`) and return
what bin/score.py prints: each pair's log-probability, its tokens'
(and its word alignment).
"""

import json
import urllib.error
import urllib.request

from tf_transformer.decoding import alignment as alignment_lib
from tf_transformer.serving import output

ALIGNMENT = "alignment"
SCORE, FORCED_ALIGNMENT = "score", "forced_alignment"
ATTENTION_OUTPUTS = ("source_tokens", "target_tokens", "cross_attention")
ALIGNMENT_OUTPUTS = ("translation", "score", *ATTENTION_OUTPUTS)
SCORE_OUTPUTS = ("log_prob", "token_log_probs", "lengths")
SIGNATURE_OUTPUTS = {"serving_default": ("translation", "score"),
                     "nbest": ("translations", "scores")}
PAIR_SIGNATURES = (SCORE, FORCED_ALIGNMENT)  # inputs `source` and `target`


class ServingError(Exception):
  """The server answered with an error, or could not be reached."""


def _check_signature(signature, readable=(*SIGNATURE_OUTPUTS, ALIGNMENT,
                                         *PAIR_SIGNATURES)):
  """Raises ValueError for a signature the client cannot read."""
  if signature not in readable:
    raise ValueError(f"signature {signature!r}: the client reads "
                     f"{sorted(readable)}")


def _inputs(signature, texts, targets=None):
  """The named inputs of a request: {"text": texts}, or for `score` and
  `forced_alignment` {"source": texts, "target": targets}."""
  _check_signature(signature)
  if signature not in PAIR_SIGNATURES:
    if targets is not None:
      raise ValueError(f"signature {signature!r} takes no targets")
    return {"text": list(texts)}
  if targets is None or len(targets) != len(texts):
    raise ValueError(f"signature {signature!r}: one target a source, got "
                     f"{len(texts)} sources and "
                     f"{'no' if targets is None else len(targets)} targets")
  return {"source": list(texts), "target": list(targets)}


def _require(outputs, keys, signature):
  """Raises ServingError naming the outputs an answer lacks."""
  missing = [key for key in keys if key not in outputs]
  if missing:
    raise ServingError(f"unexpected answer from the {signature} signature: "
                       f"no {', '.join(missing)} (exported before it had "
                       "them? export it again)")


def _outputs_of(signature):
  """The (translations, scores) output names of a pairs signature."""
  _check_signature(signature, SIGNATURE_OUTPUTS)
  return SIGNATURE_OUTPUTS[signature]


def _pairs(texts, scores):
  """Columns as the signature returns them -> [[(text, score), ...]]."""
  if texts and not isinstance(texts[0], list):  # serving_default: [batch]
    texts, scores = [[t] for t in texts], [[s] for s in scores]
  return [[(_text(t), float(s)) for t, s in zip(row, row_scores)]
          for row, row_scores in zip(texts, scores)]


def _text(value):
  return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def aligned(outputs, layer=None):
  """The `alignment` signature's outputs -> [(translation, score,
  alignment)], one an input.

  Args:
    outputs: {name: a nested list (REST's JSON) or a numpy array (gRPC)}
      of `ALIGNMENT_OUTPUTS`.
    layer: the decoder layer whose attention aligns, from 1 (None: the
      last); ValueError naming --alignment_layer where there is none.
  Returns:
    The triples, the alignment as Pharaoh pairs "i-j".
  """
  _require(outputs, ALIGNMENT_OUTPUTS, ALIGNMENT)
  return alignment_lib.aligned(outputs, layer)


def scored(outputs, alignment=False, layer=None):
  """The `score` (or with `alignment`, `forced_alignment`) signature's
  outputs -> [(log_prob, [token log-probs])] or, with `alignment`,
  [(log_prob, [token log-probs], alignment)], one a pair.

  Args:
    outputs: {name: a nested list (REST's JSON) or a numpy array (gRPC)}
      of `SCORE_OUTPUTS` (and `ATTENTION_OUTPUTS`).
    alignment, layer: as `aligned`'s.
  Returns:
    What bin/score.py prints (`output.score_rows`).
  """
  _require(outputs, SCORE_OUTPUTS + (ATTENTION_OUTPUTS if alignment else ()),
           _score_signature(alignment))
  return output.score_rows(outputs, alignment, layer)


def _score_signature(alignment):
  """`forced_alignment` with alignments, else `score`."""
  return FORCED_ALIGNMENT if alignment else SCORE


# REST.

def rest_url(server, model_name, version=None):
  """`server` is HOST:PORT or a URL (http://HOST:8501)."""
  base = server if "://" in server else f"http://{server}"
  path = f"/v1/models/{model_name}"
  if version is not None:
    path += f"/versions/{version}"
  return base.rstrip("/") + path + ":predict"


def rest_request(texts, signature="serving_default", targets=None):
  """The JSON body: columnar inputs, the format that also accepts batches
  with more than one output per input. `targets` go with `texts` (the
  sources) to `score` and `forced_alignment`."""
  return {"signature_name": signature,
          "inputs": _inputs(signature, texts, targets)}


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
  """[[(translation, score), ...n-best], ...] for `texts` from a server."""
  return parse_rest_response(
      _rest_answer(server, model_name, texts, signature, version, timeout),
      signature)


def rest_align(server, model_name, texts, layer=None, version=None,
               timeout=60.0):
  """[(translation, score, alignment), ...] for `texts` (`aligned`)."""
  return aligned(_rest_outputs(_rest_answer(
      server, model_name, texts, ALIGNMENT, version, timeout)), layer)


def rest_score(server, model_name, sources, targets, alignment=False,
               layer=None, version=None, timeout=60.0):
  """[(log_prob, [token log-probs])] of each (source, target) pair, with
  `alignment` [(log_prob, [...], alignment)] (`scored`)."""
  return scored(_rest_outputs(_rest_answer(
      server, model_name, sources, _score_signature(alignment), version,
      timeout, targets)), alignment, layer)


def _rest_outputs(body):
  """An answer's outputs; ServingError for an error or no outputs."""
  if "error" in body:
    raise ServingError(body["error"])
  if not isinstance(body.get("outputs"), dict):
    raise ServingError(f"unexpected answer (no outputs): "
                       f"{json.dumps(body)[:200]}")
  return body["outputs"]


def _rest_answer(server, model_name, texts, signature, version, timeout,
                 targets=None):
  """The server's decoded JSON answer, an error's too."""
  body = rest_request(texts, signature, targets)
  request = urllib.request.Request(
      rest_url(server, model_name, version),
      data=json.dumps(body).encode("utf-8"),
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
  return body


# gRPC.

def _serving_api():
  try:
    # pylint: disable=g-import-not-at-top
    from tensorflow_serving.apis import predict_pb2
    from tensorflow_serving.apis import prediction_service_pb2_grpc
  except ImportError as e:
    raise ImportError("gRPC needs tensorflow-serving-api: pip install "
                      "'tensorflow-serving-api~=2.21.0' (in a clone of "
                      "tf_transformer: pip install '.[serving]')") from e
  return predict_pb2, prediction_service_pb2_grpc


def grpc_request(texts, model_name, signature="serving_default",
                 version=None, targets=None):
  """A tensorflow.serving.PredictRequest for `texts` (with `targets`, the
  sources of `score` and `forced_alignment`)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  inputs = _inputs(signature, texts, targets)
  predict_pb2, _ = _serving_api()
  request = predict_pb2.PredictRequest()
  request.model_spec.name = model_name
  request.model_spec.signature_name = signature
  if version is not None:
    request.model_spec.version.value = int(version)
  for name, strings in inputs.items():
    request.inputs[name].CopyFrom(tf.make_tensor_proto(
        [t.encode("utf-8") for t in strings], dtype=tf.string,
        shape=[len(strings)]))
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
  """[[(translation, score), ...n-best], ...] for `texts` from a server."""
  return parse_grpc_response(
      _grpc_answer(server, model_name, texts, signature, version, timeout),
      signature)


def grpc_align(server, model_name, texts, layer=None, version=None,
               timeout=60.0):
  """[(translation, score, alignment), ...] for `texts` (`aligned`)."""
  return aligned(_grpc_outputs(_grpc_answer(
      server, model_name, texts, ALIGNMENT, version, timeout)), layer)


def grpc_score(server, model_name, sources, targets, alignment=False,
               layer=None, version=None, timeout=60.0):
  """`rest_score` over gRPC."""
  return scored(_grpc_outputs(_grpc_answer(
      server, model_name, sources, _score_signature(alignment), version,
      timeout, targets)), alignment, layer)


def _grpc_outputs(response):
  """A PredictResponse's outputs as numpy arrays."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return {key: tf.make_ndarray(value)
          for key, value in response.outputs.items()}


def _grpc_answer(server, model_name, texts, signature, version, timeout,
                 targets=None):
  """The server's PredictResponse."""
  import grpc  # pylint: disable=g-import-not-at-top
  _, service = _serving_api()
  # The alignment signature's weights, [batch, layers, T, S] float32, can
  # outgrow gRPC's default 4 MB answer (9.8 MB for 64 sentences of 80
  # subwords and 6 layers).
  options = [("grpc.max_receive_message_length", 1 << 30)]
  with grpc.insecure_channel(server, options=options) as channel:
    stub = service.PredictionServiceStub(channel)
    try:
      return stub.Predict(grpc_request(texts, model_name, signature,
                                       version, targets), timeout)
    except grpc.RpcError as e:
      raise ServingError(f"{e.code().name}: {e.details()}") from e
