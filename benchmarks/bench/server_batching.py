"""TF Serving's server-side batching (`--enable_batching`) measured without
the server binary: the same batching library, TensorFlow's `BatchFunction`
op (`tf.nondifferentiable_batch_function`, on which the model server's
shared batch scheduler is built), around an export's signature, called by
concurrent clients with one sentence a call, as a server's requests arrive.
"""

import dataclasses

import numpy as np
import tensorflow as tf

from bench import serving_worker


@dataclasses.dataclass(frozen=True)
class Setting:
  """One batching_parameters.txt; `batch_threads` 0 means no batching."""
  batch_threads: int = 0
  timeout_us: int = 0
  max_batch_size: int = 32
  max_enqueued_batches: int = 100

  @property
  def name(self):
    if not self.batch_threads:
      return "no batching"
    return (f"{self.batch_threads} batch thread(s), {self.timeout_us} us, "
            f"up to {self.max_batch_size}")


def batched(translate, setting):
  """`translate` (a [batch] string tensor -> [batch] strings) as the model
  server runs it under `setting`: requests queued and concatenated on
  dimension 0, the result split back."""
  if not setting.batch_threads:
    return translate

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string)],
               autograph=False)
  def call(text):
    @tf.nondifferentiable_batch_function(
        setting.batch_threads, setting.max_batch_size, setting.timeout_us,
        max_enqueued_batches=setting.max_enqueued_batches)
    def inner(text):
      return translate(text)
    return inner(text)
  call.get_concrete_function()  # traced once, not by every client thread
  return call


def concurrent_clients(call, sentences, clients):
  """`clients` threads send `sentences` one a call (`serving_worker`'s
  concurrency measure). Returns a dict of sentences_per_second, p50_ms,
  p99_ms, cpu_seconds (this process's) and outputs (in the order of
  `sentences`)."""
  measured = serving_worker.concurrency(
      lambda texts: [t.decode() for t in call(tf.constant(texts)).numpy()],
      sentences, clients)
  return {"sentences_per_second": len(sentences) / measured["seconds"],
          "p50_ms": float(np.percentile(measured["call_seconds"], 50)) * 1e3,
          "p99_ms": float(np.percentile(measured["call_seconds"], 99)) * 1e3,
          "cpu_seconds": measured["cpu_seconds"],
          "outputs": measured["outputs"]}


def compare(translate, sentences, settings, clients=8, rounds=2):
  """Every setting in turn for `rounds` rounds (after one untimed pass
  each). Returns rows (round, setting name, figures, lines equal to the
  first setting's in the same round)."""
  calls = [(s.name, batched(translate, s)) for s in settings]
  for _, call in calls:
    concurrent_clients(call, sentences, clients)
  rows = []
  for round_index in range(rounds):
    first = None
    for name, call in calls:
      figures = concurrent_clients(call, sentences, clients)
      first = first or figures["outputs"]
      same = sum(a == b for a, b in zip(figures["outputs"], first))
      rows.append({"round": round_index, "setting": name, "same": same,
                   **{k: v for k, v in figures.items() if k != "outputs"}})
  return rows
