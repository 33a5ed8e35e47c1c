"""The serving benchmark: a trained run's exports decoding real text, beside
CTranslate2 on the same weights, in one run of benchmarks/benchmark.py.

Each decoder runs in a fresh process (`serving_worker.py`) on the same
sentences, one decoder after another: the SavedModel as TF Serving loads it
(only tensorflow and tensorflow_text imported), default export and `xla`
export, each with oneDNN on and off (TF_ENABLE_ONEDNN_OPTS, read at start),
and the default export in --threads parts (`--decode_parts`) served with one
intra-op thread; the default and parts exports in bfloat16 (`--dtype`),
and the default float32 export rewritten to bfloat16 at load as TF Serving's
`--mixed_precision=bfloat16` does (Grappler's
auto_mixed_precision_onednn_bfloat16, the option that flag sets);
CTranslate2 float32 and int8 (quantized at load) with its own beam search
(beam, length penalty and limit as ours; its default patience of 1), and
float32 without Intel MKL (CT2_USE_MKL=0: on an Intel CPU its wheel picks
MKL, which can be the slower backend); the
default and bfloat16 exports over the run's vocabulary shortlist (export
--shortlist=K,N), and CTranslate2 float32 over the same table as its vmap. At
--serving_batch_size in file order and length-sorted, one sentence at a
time for latency (wall and CPU time), and from `clients` threads calling one
loaded model at once, one sentence a call (TF Serving's concurrent
requests; CTranslate2's inter_threads); beam search and greedy decoding.
For each SavedModel, the kernels a decoding step executes, from a profiler
trace, at batch 1 and at the batch size.
"""

import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

import sacrebleu
import sentencepiece as spm

from tf_transformer.decoding.search import DecodingOptions

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                      "serving_worker.py")


@dataclasses.dataclass(frozen=True)
class Decoder:
  name: str
  kind: str = "saved_model"  # or "ctranslate2"
  xla: bool = False
  onednn: bool = True
  # Parts of a request decoded at once (export --decode_parts), each on one
  # inter-op thread, served with one intra-op thread.
  parallel: bool = False
  compute_type: str = "float32"  # CTranslate2's; a SavedModel's is `dtype`
  dtype: str = "float32"  # the export's (bin/export.py --dtype)
  # Served with TF Serving's --mixed_precision=bfloat16: the float32 graph
  # rewritten to bfloat16 at load.
  server_bfloat16: bool = False
  # Over the run's vocabulary shortlist (export --shortlist; CTranslate2's
  # vmap of the same table).
  shortlist: bool = False
  # CTranslate2: Intel MKL's GEMM where its wheel picks it (Intel CPUs);
  # False: CT2_USE_MKL=0, its other backends.
  mkl: bool = True


DECODERS = {d.name: d for d in (
    Decoder("savedmodel"),  # oneDNN on (TensorFlow's default on this CPU)
    Decoder("savedmodel_no_onednn", onednn=False),
    Decoder("savedmodel_parts", parallel=True),
    Decoder("savedmodel_bfloat16", dtype="bfloat16"),
    Decoder("savedmodel_parts_bfloat16", parallel=True, dtype="bfloat16"),
    Decoder("savedmodel_server_bfloat16", server_bfloat16=True),
    Decoder("savedmodel_xla", xla=True),
    Decoder("savedmodel_xla_no_onednn", xla=True, onednn=False),
    Decoder("savedmodel_shortlist", shortlist=True),
    Decoder("savedmodel_shortlist_no_onednn", onednn=False, shortlist=True),
    Decoder("savedmodel_bfloat16_shortlist", dtype="bfloat16",
            shortlist=True),
    Decoder("ct2_float32", "ctranslate2"),
    Decoder("ct2_int8", "ctranslate2", compute_type="int8"),
    Decoder("ct2_float32_vmap", "ctranslate2", shortlist=True),
    Decoder("ct2_int8_vmap", "ctranslate2", compute_type="int8",
            shortlist=True),
    Decoder("ct2_float32_no_mkl", "ctranslate2", mkl=False),
)}
BASELINE = "ct2_float32"  # every ratio is to this decoder
OURS = "savedmodel"  # "identical" compares with this one


@dataclasses.dataclass
class Settings:
  sentences: list
  references: list = None
  batch_size: int = 32
  orders: tuple = ("file", "sorted")
  searches: tuple = ("beam", "greedy")
  decoders: tuple = tuple(DECODERS)
  threads: int = 2
  runs: int = 3
  warmup: int = 1
  latency_sentences: int = 100
  ct2_patience: int = 1
  clients: int = 8  # concurrent callers; 0: no concurrency figures
  profile_sentences: int = 10  # one-sentence requests traced; 0: none
  shortlist: tuple = (20, 300)  # K, N of export --shortlist


def _key(decoder):
  """What tells one decoder's export from another's."""
  if decoder.kind == "ctranslate2":
    return (decoder.shortlist,)
  return decoder.xla, decoder.parallel, decoder.dtype, decoder.shortlist


def _exports(model_dir, directory, settings, log):
  """{(search, `_key`): SavedModel path}, {`_key`: CTranslate2 path} and
  the decoding options. The run's shortlist table is built first where a
  decoder needs it and the run has none."""
  # pylint: disable=g-import-not-at-top
  from tf_transformer.data import shortlist_table
  from tf_transformer.serving.translation_module import TranslationModule
  from tf_transformer.model import with_dtype_policy
  from tf_transformer.run import loading
  from tf_transformer.run import run_dir
  from tf_transformer.run.runner import Runner
  from tf_transformer.interop import ct2
  from tf_transformer.serving import export as export_lib
  model, vocabulary = run_dir.load_trained_model(model_dir)
  models = {"float32": model}
  beam = DecodingOptions.from_config(model.config)
  decoders = [DECODERS[d] for d in settings.decoders]
  shortlist = None
  if any(d.shortlist for d in decoders):
    if not os.path.exists(os.path.join(model_dir, shortlist_table.FILENAME)):
      log(f"building the shortlist table of {model_dir} ...")
      Runner(model_dir).build_shortlist()
    shortlist = loading.load_shortlist(model_dir, vocabulary,
                                       *settings.shortlist)
  paths = {}
  for search in settings.searches:
    options = DecodingOptions.from_config(model.config, method=search)
    for key in sorted({_key(d) for d in decoders
                       if d.kind == "saved_model"}):
      xla, parallel, dtype, listed = key
      if dtype not in models:
        models[dtype] = with_dtype_policy(model, dtype)
      module = TranslationModule(
          models[dtype], vocabulary, options, xla=xla,
          decode_parts=settings.threads if parallel else 1,
          shortlist=shortlist if listed else None)
      paths[search, key] = export_lib.export(module, os.path.join(
          directory, f"{search}_xla{int(xla)}_p{int(parallel)}_{dtype}_"
          f"shortlist{int(listed)}"))
  for key in {_key(d) for d in decoders if d.kind == "ctranslate2"}:
    paths[key] = ct2.export(
        model, vocabulary, os.path.join(directory, f"ct2_{int(key[0])}"),
        beam, shortlist=shortlist if key[0] else None)
  return paths, beam


def _ct2_search(search, options, patience):
  if search == "greedy":
    return dict(beam_size=1,
                max_length_offset=options.max_decode_length_offset)
  return dict(beam_size=options.beam_size,
              length_penalty=options.length_penalty_alpha, patience=patience,
              max_length_offset=options.max_decode_length_offset)


def run_worker(worker, request, env_changes=None, what="worker"):
  """(stdout as JSON, stderr) of the script `worker` run on `request`
  (written to a JSON file it gets as its argument) in a process of its own,
  with `env_changes` and this clone on PYTHONPATH (the workers import
  tf_transformer's timing protocol, installed or not). Raises RuntimeError
  naming `what`, with the worker's error, where it fails."""
  with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
    json.dump(request, f)
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=os.pathsep.join(
      filter(None, (REPO, os.environ.get("PYTHONPATH")))),
             **(env_changes or {}))
  try:
    done = subprocess.run([sys.executable, worker, f.name], env=env,
                          capture_output=True, text=True, check=False)
  finally:
    os.unlink(f.name)
  if done.returncode:
    raise RuntimeError(f"{what} failed:\n{done.stderr[-3000:]}")
  return json.loads(done.stdout), done.stderr


def _run_worker(request, env_changes):
  result, stderr = run_worker(
      WORKER, request, env_changes,
      f"serving worker ({request['kind']} {request['model']})")
  if request["kind"] == "ctranslate2":  # logged at CT2_VERBOSE=1
    backend = re.search(r"SGEMM backend: (.*)", stderr)
    result["ct2_sgemm_backend"] = (backend.group(1).strip() if backend
                                   else "not logged")
  return result


def measure(model_dir, settings: Settings, log=print):
  """{search: {decoder: worker result}} and the decoding options."""
  with tempfile.TemporaryDirectory() as directory:
    log(f"exporting {model_dir} ...")
    paths, options = _exports(model_dir, directory, settings, log)
    results = {}
    for search in settings.searches:
      for name in settings.decoders:
        decoder = DECODERS[name]
        request = dict(
            kind=decoder.kind, sentences=settings.sentences,
            threads=settings.threads, runs=settings.runs,
            intra_threads=1 if decoder.parallel else settings.threads,
            warmup=settings.warmup, batch_size=settings.batch_size,
            orders=list(settings.orders),
            latency_sentences=settings.latency_sentences,
            clients=settings.clients,
            profile_sentences=settings.profile_sentences)
        if decoder.kind == "saved_model":
          request["model"] = paths[search, _key(decoder)]
          if decoder.server_bfloat16:
            request["grappler"] = {
                "auto_mixed_precision_onednn_bfloat16": True}
        else:
          request.update(model=paths[_key(decoder)],
                         compute_type=decoder.compute_type,
                         search=dict(_ct2_search(search, options,
                                                 settings.ct2_patience),
                                     use_vmap=decoder.shortlist))
        log(f"{search}: {name} ...")
        result = _run_worker(request, worker_env(decoder))
        if "ct2_sgemm_backend" in result:
          log(f"{search}: {name}: CTranslate2's float32 GEMM is "
              f"{result['ct2_sgemm_backend']}")
        results.setdefault(search, {})[name] = result
  return results, options


def worker_env(decoder):
  """The environment a decoder's worker starts with, beyond ours: the
  switches its library reads at load (oneDNN's rewrites; CTranslate2's
  MKL)."""
  if decoder.kind == "saved_model":
    return {"TF_ENABLE_ONEDNN_OPTS": str(int(decoder.onednn))}
  # CT2_VERBOSE=1: CTranslate2 logs the GEMM backends it picked, at load.
  return {"CT2_VERBOSE": "1", **({} if decoder.mkl else {"CT2_USE_MKL": "0"})}


def _count_tokens(processor, outputs):
  """Output subwords, the EOS of each sentence included."""
  return sum(len(p) + 1 for p in processor.encode(outputs))


def summarize(results, settings: Settings, vocabulary_path):
  """Rows of figures: {"throughput": per (search, order, decoder),
  "latency" and "concurrency": per (search, decoder), "kernels": per
  (search, SavedModel decoder, batch)}."""
  processor = spm.SentencePieceProcessor(model_file=vocabulary_path)
  n = len(settings.sentences)
  throughput, latency, concurrency, kernels = [], [], [], []
  for search, by_decoder in results.items():
    for order in settings.orders:
      rows = []
      for name, result in by_decoder.items():
        measured = result["orders"][order]
        seconds = statistics.median(measured["seconds"])
        outputs = measured["outputs"]
        row = dict(search=search, order=order, decoder=name,
                   sentences_per_second=n / seconds,
                   sentences_per_cpu_second=n / statistics.median(
                       measured["cpu_seconds"]),
                   output_tokens_per_second=_count_tokens(
                       processor, outputs) / seconds,
                   seconds=measured["seconds"])
        if OURS in by_decoder:
          ours = by_decoder[OURS]["orders"]["file"]["outputs"]
          row["lines_unlike_ours"] = [
              line for line, (a, b) in enumerate(zip(outputs, ours))
              if a != b]
          row["identical_to_ours"] = 1 - len(row["lines_unlike_ours"]) / n
        if settings.references:
          row["bleu"] = sacrebleu.corpus_bleu(
              outputs, [settings.references]).score
        rows.append(row)
      _add_ratios(rows, "sentences_per_second")
      _add_ratios(rows, "sentences_per_cpu_second")
      throughput += rows
    latency += _latency_rows(search, by_decoder)
    concurrency += _concurrency_rows(search, by_decoder)
    kernels += [dict(search=search, decoder=name, batch=batch,
                     **{key: value for key, value in counts.items()
                        if key != "by_type"}, by_type=counts["by_type"])
                for name, result in by_decoder.items()
                for batch, counts in result.get("kernels", {}).items()
                # An XLA export's loop is one compiled program: no steps.
                if counts["steps"]]
  return {"throughput": throughput, "latency": latency,
          "concurrency": concurrency, "kernels": kernels}


def _latency_rows(search, by_decoder):
  rows = []
  for name, result in by_decoder.items():
    if "latency_seconds" not in result:
      continue
    seconds = sorted(result["latency_seconds"])
    cpu = sorted(result["latency_cpu_seconds"])
    rows.append(dict(search=search, decoder=name,
                     p50_ms=1000 * _quantile(seconds, 0.5),
                     p90_ms=1000 * _quantile(seconds, 0.9),
                     cpu_ms=1000 * _quantile(cpu, 0.5),
                     sentences=len(seconds)))
  _add_ratios(rows, "p50_ms")
  _add_ratios(rows, "cpu_ms")
  return rows


def _concurrency_rows(search, by_decoder):
  rows = []
  for name, result in by_decoder.items():
    if "concurrency" not in result:
      continue
    measured = result["concurrency"]
    calls = sorted(measured["call_seconds"])
    rows.append(dict(search=search, decoder=name,
                     clients=measured["clients"],
                     sentences_per_second=len(calls) / measured["seconds"],
                     p50_ms=1000 * _quantile(calls, 0.5),
                     p99_ms=1000 * _quantile(calls, 0.99)))
  _add_ratios(rows, "sentences_per_second")
  return rows


def _quantile(sorted_values, q):
  return sorted_values[min(len(sorted_values) - 1,
                           int(q * len(sorted_values)))]


def _add_ratios(rows, key):
  base = [r[key] for r in rows if r["decoder"] == BASELINE]
  for row in rows:
    row[f"{key}_vs_{BASELINE}"] = row[key] / base[0] if base else None
