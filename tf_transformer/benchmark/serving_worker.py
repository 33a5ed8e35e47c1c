"""Times one exported model on real text in a process of its own, as a
server would run it: run by path (`python serving_worker.py REQUEST.json`),
it imports only tensorflow and tensorflow_text for a SavedModel (so nothing
of tf_transformer, not even its oneDNN default, reaches the measurement), or
only ctranslate2 and sentencepiece for a CTranslate2 model.

The request (JSON): kind ("saved_model" or "ctranslate2"), model, sentences,
threads (TensorFlow's inter-op threads, CTranslate2's threads), intra_threads
(TensorFlow's), runs, warmup, batch_size, orders (["file", "sorted"]),
latency_sentences, for a SavedModel optionally grappler (Grappler options set
before loading, as a server's session config sets them), and for CTranslate2
compute_type and search (the translate_batch options). Prints JSON: per order
the seconds of each timed pass over all sentences and the outputs in file
order; for latency the seconds of each single-sentence call.
"""

import json
import sys
import time


def _saved_model(request):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_text  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  tf.config.threading.set_intra_op_parallelism_threads(
      request["intra_threads"])
  tf.config.threading.set_inter_op_parallelism_threads(request["threads"])
  tf.config.optimizer.set_experimental_options(request.get("grappler", {}))
  serve = tf.saved_model.load(request["model"]).signatures["serving_default"]

  def translate(texts):
    out = serve(text=tf.constant(texts, tf.string, shape=[len(texts)]))
    return [t.decode("utf-8") for t in out["translation"].numpy()]
  return translate


def _ctranslate2(request):
  import ctranslate2  # pylint: disable=g-import-not-at-top
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  translator = ctranslate2.Translator(
      request["model"], device="cpu", compute_type=request["compute_type"],
      intra_threads=request["threads"], inter_threads=1)
  processor = spm.SentencePieceProcessor(
      model_file=request["model"] + "/vocabulary.model")
  search = request["search"]
  offset = search.pop("max_length_offset")

  def translate(texts):
    pieces = processor.encode(texts, out_type=str)
    results = translator.translate_batch(
        pieces, max_decoding_length=max(len(p) for p in pieces) + offset,
        **search)
    return [processor.decode(r.hypotheses[0]) for r in results]
  return translate


def _passes(translate, sentences, batch_size, order, runs, warmup):
  """Seconds of each timed pass over `sentences` and the outputs, in file
  order; `order` "sorted" batches the sentences by length (and puts the
  outputs back)."""
  indices = list(range(len(sentences)))
  if order == "sorted":
    indices.sort(key=lambda i: (len(sentences[i].split()),
                                len(sentences[i])))
  batches = [indices[i:i + batch_size]
             for i in range(0, len(indices), batch_size)]
  for _ in range(warmup):
    translate([sentences[i] for i in batches[0]])
  seconds, outputs = [], [None] * len(sentences)
  for _ in range(runs):
    start = time.perf_counter()
    for batch in batches:
      for i, text in zip(batch, translate([sentences[i] for i in batch])):
        outputs[i] = text
    seconds.append(time.perf_counter() - start)
  return seconds, outputs


def _latency(translate, sentences, warmup):
  """Seconds of each one-sentence call, after `warmup` untimed passes over
  the same sentences (as a warmed-up server: an XLA export compiles once per
  request shape, on its first request of that shape)."""
  for _ in range(warmup):
    for text in sentences:
      translate([text])
  seconds = []
  for text in sentences:
    start = time.perf_counter()
    translate([text])
    seconds.append(time.perf_counter() - start)
  return seconds


def main(path):
  with open(path, encoding="utf-8") as f:
    request = json.load(f)
  load = _saved_model if request["kind"] == "saved_model" else _ctranslate2
  start = time.perf_counter()
  translate = load(request)
  result = {"load_seconds": time.perf_counter() - start, "orders": {}}
  sentences = request["sentences"]
  for order in request["orders"]:
    seconds, outputs = _passes(translate, sentences, request["batch_size"],
                               order, request["runs"], request["warmup"])
    result["orders"][order] = {"seconds": seconds, "outputs": outputs}
  if request["latency_sentences"]:
    result["latency_seconds"] = _latency(
        translate, sentences[:request["latency_sentences"]],
        request["warmup"])
  json.dump(result, sys.stdout)


if __name__ == "__main__":
  main(sys.argv[1])
