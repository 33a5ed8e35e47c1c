"""Times one exported model on real text in a process of its own, as a
server would run it: run by path (`python serving_worker.py REQUEST.json`),
it imports tensorflow and tensorflow_text for a SavedModel, or ctranslate2
and sentencepiece for a CTranslate2 model, and of tf_transformer only the
timing protocol the student job times with too
(`tf_transformer/run/export_speed.py`: loading a SavedModel's signature,
the passes, the one-sentence calls); oneDNN is set by the request's
environment (`serving_speed.worker_env`).

The request (JSON): kind ("saved_model" or "ctranslate2"), model, sentences,
threads (TensorFlow's inter-op threads, CTranslate2's threads), intra_threads
(TensorFlow's), runs, warmup, batch_size, orders (["file", "sorted"]),
latency_sentences, clients (concurrent callers, 0 for none), for a
SavedModel optionally grappler (Grappler options set before loading, as a
server's session config sets them) and profile_sentences (kernels counted
from a profiler trace, `kernel_trace.py`), and for CTranslate2 compute_type
and search (the translate_batch options). Prints JSON: per order the seconds
of each timed pass over all sentences and the outputs in file order; for
latency the seconds and CPU-seconds of each single-sentence call; for
concurrency `clients` threads calling one loaded model with one sentence a
call, as a server runs concurrent requests: the wall seconds of the whole and
of each call, the CPU-seconds and the outputs; the kernels a decoding step
runs at batch 1 and at batch_size.
"""

import json
import sys
import tempfile
import threading
import time

from tf_transformer.run import export_speed


def _saved_model(request):
  return export_speed.saved_model(
      request["model"], request["threads"], request["intra_threads"],
      request.get("grappler"))


def _ctranslate2(request, inter_threads=1):
  """`inter_threads` > 1: that many requests at once, one thread each
  (CTranslate2's way to serve concurrent callers)."""
  import ctranslate2  # pylint: disable=g-import-not-at-top
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  translator = ctranslate2.Translator(
      request["model"], device="cpu", compute_type=request["compute_type"],
      intra_threads=request["threads"] if inter_threads == 1 else 1,
      inter_threads=inter_threads)
  processor = spm.SentencePieceProcessor(
      model_file=request["model"] + "/vocabulary.model")
  search = dict(request["search"])
  offset = search.pop("max_length_offset")

  def translate(texts):
    pieces = processor.encode(texts, out_type=str)
    # Our limit: the longest source + its EOS + the offset, EOS included
    # (translators/ct2_runtime.py).
    results = translator.translate_batch(
        pieces, max_decoding_length=max(len(p) for p in pieces) + 1 + offset,
        **search)
    return [processor.decode(r.hypotheses[0]) for r in results]
  return translate


def concurrency(translate, sentences, clients):
  """`clients` threads share `sentences`, each sending one sentence a call
  until none is left: the wall seconds of the whole and of each call, this
  process's CPU-seconds, and the outputs in the order of `sentences`."""
  queue = list(reversed(list(enumerate(sentences))))
  lock = threading.Lock()
  calls, outputs = [], [None] * len(sentences)

  def client():
    while True:
      with lock:
        if not queue:
          return
        index, text = queue.pop()
      start = time.perf_counter()
      output = translate([text])[0]
      with lock:
        calls.append(time.perf_counter() - start)
        outputs[index] = output
  for text in sentences[:clients]:  # warm-up
    translate([text])
  threads = [threading.Thread(target=client) for _ in range(clients)]
  start, cpu_start = time.perf_counter(), time.process_time()
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  return {"seconds": time.perf_counter() - start, "call_seconds": calls,
          "cpu_seconds": time.process_time() - cpu_start,
          "outputs": outputs, "clients": clients}


def _kernels(translate, sentences, batch_size):
  """Kernels a decoding step executes, one sentence a request (over
  `sentences`) and one request of `batch_size` sentences. Run before the
  timed passes: once TensorFlow's executor has measured a kernel as cheap it
  runs it inline and may leave it out of the trace (after the timed passes
  the same model showed 120-185 kernels a step instead of 340)."""
  import kernel_trace  # pylint: disable=g-import-not-at-top
  counts = {}
  for label, requests in (
      ("batch_1", [[text] for text in sentences]),
      (f"batch_{batch_size}", [sentences[:batch_size]])):
    translate(requests[0])
    with tempfile.TemporaryDirectory() as logdir:
      kernel_trace.trace(lambda: [translate(r) for r in requests], logdir)
      counts[label] = kernel_trace.step_counts(
          kernel_trace.executed_kernels(logdir))
    counts[label]["steps_per_request"] = (counts[label]["steps"]
                                          / len(requests))
  return counts


def main(path):
  with open(path, encoding="utf-8") as f:
    request = json.load(f)
  load = _saved_model if request["kind"] == "saved_model" else _ctranslate2
  start = time.perf_counter()
  translate = load(request)
  result = {"load_seconds": time.perf_counter() - start, "orders": {}}
  sentences = request["sentences"]
  if request.get("profile_sentences") and request["kind"] == "saved_model":
    # First, while the executor still traces every kernel (see `_kernels`).
    result["kernels"] = _kernels(
        translate, sentences[:request["profile_sentences"]],
        request["batch_size"])
  for order in request["orders"]:
    seconds, cpu_seconds, outputs = export_speed.passes(
        translate, sentences, request["batch_size"], order, request["runs"],
        request["warmup"])
    result["orders"][order] = {"seconds": seconds, "cpu_seconds": cpu_seconds,
                               "outputs": outputs}
  latency_sentences = sentences[:request["latency_sentences"]]
  if latency_sentences:
    result["latency_seconds"], result["latency_cpu_seconds"] = export_speed.latency(
        translate, latency_sentences, request["warmup"])
  if request.get("clients") and latency_sentences:
    if request["kind"] == "ctranslate2":
      translate = _ctranslate2(request, inter_threads=request["threads"])
    result["concurrency"] = concurrency(translate, latency_sentences,
                                        request["clients"])
  json.dump(result, sys.stdout)


if __name__ == "__main__":
  main(sys.argv[1])
