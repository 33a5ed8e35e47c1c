"""benchmarks/benchmark.py's sections: each measures with the modules of this
package, prints its table as it goes and adds its figures to the report
(`run`). They read the flag values `o` (benchmark_flags) and no global
flags."""

import dataclasses
import json
import os
import tempfile
import time

def _variants(o):
  from bench.training_speed import Variant  # pylint: disable=g-import-not-at-top
  known = {"default": Variant("default"),
           "no_xla_loss": Variant("no_xla_loss", xla_loss=False),
           "xla_attention": Variant("xla_attention", xla_attention=True),
           "bfloat16": Variant("bfloat16", mixed_precision="bfloat16"),
           "mirrored": Variant(f"mirrored_{o.cpu_devices}cpu",
                               devices=o.cpu_devices)}
  unknown = set(o.train_variants) - set(known)
  if unknown:
    raise ValueError(f"--train_variants: unknown {sorted(unknown)}; "
                         f"known: {sorted(known)}")
  return [known[name] for name in o.train_variants]


def _print_header(title, columns):
  print(f"\n{title}")
  print("  " + "  ".join(f"{c:>22}" for c in columns), flush=True)


def _print_rows(rows, columns):
  for row in rows:
    print("  " + "  ".join(
        f"{row.get(c, ''):>22.4g}" if isinstance(row.get(c), float)
        else f"{str(row.get(c, '')):>22}" for c in columns), flush=True)


def train_section(o, config, report, peak):
  from bench import training_speed  # pylint: disable=g-import-not-at-top
  rows = []
  columns = ["variant", "seconds_per_step", "tokens_per_sec",
             "model_gflops_per_sec", "mfu"]
  _print_header(f"training: {o.batch_tokens} tokens a side, sentences "
                f"of {o.source_length}", columns)
  for variant in _variants(o):
    try:
      rows.append(training_speed.measure(
          config, variant, o.batch_tokens, o.source_length,
          o.runs, o.warmup, peak))
    except Exception as e:  # pylint: disable=broad-except
      # A variant this machine cannot run is reported, not fatal: its
      # error's type and last line (where TensorFlow says what failed,
      # after the trace of where).
      lines = [l for l in str(e).splitlines() if l.strip()] or [""]
      rows.append({"variant": variant.name,
                   "error": f"{type(e).__name__}: {lines[-1]}"[:300]})
    _print_rows(rows[-1:], columns + ["error"])
  report["train"] = rows


def scaling_section(o, config, report, peak):
  from bench import training_speed  # pylint: disable=g-import-not-at-top
  variant = training_speed.Variant("default")
  columns = ["length", "rows", "seconds_per_step", "tokens_per_sec", "mfu"]
  _print_header("training cost against sentence length", columns)
  rows = []
  for length in o.scaling_lengths:
    rows.append(training_speed.measure(config, variant, o.batch_tokens,
                                       int(length), o.runs, o.warmup,
                                       peak))
    _print_rows(rows[-1:], columns)
  report["scaling"] = rows


def decode_section(o, config, report):
  # pylint: disable=g-import-not-at-top
  import keras
  from tf_transformer import build_model
  from bench import decoding_speed
  from tf_transformer.decoding.search import DecodingOptions
  vocabulary = decoding_speed.synthetic_vocabulary(config.model.vocab_size)
  config = config.replace(vocab_size=vocabulary.vocab_size)
  keras.utils.set_random_seed(o.model_seed)
  model = build_model(config)
  texts = decoding_speed.sentences(vocabulary, o.decode_sentences,
                                   o.decode_words)
  rows = []
  columns = ["search", "batch_size", "sentences_per_sec",
             "output_tokens_per_sec", "output_tokens_per_sentence"]
  _print_header("decoding (exported SavedModel, text in and out)", columns)
  for method in ("beam", "greedy"):
    with tempfile.TemporaryDirectory(prefix="tf_transformer_bench_") as tmp:
      loaded = decoding_speed.load_export(decoding_speed.export_model(
          model, vocabulary, DecodingOptions(
              method=method, max_decode_length_offset=1), tmp))
      for batch_size in sorted({1, o.decode_batch_size}):
        # Batch 1 over every sentence would take long: 1/8 of them.
        subset = texts if batch_size > 1 else texts[:max(
            8, len(texts) // 8)]
        row = decoding_speed.measure_saved_model(loaded, vocabulary, subset,
                                                 batch_size, o.runs)
        rows.append({"search": "beam 4" if method == "beam" else "greedy",
                     **row})
        _print_rows(rows[-1:], columns)
  print()
  steps = [int(n) for n in o.token_steps]
  per_token = decoding_speed.time_per_token(
      model, vocabulary, steps, batch_sizes=sorted({1, o.decode_batch_size}),
      runs=o.runs)
  for batch, figures in per_token.items():
    print(f"beam 4 decode time per output token, {batch.replace('_', ' ')}: "
          + ", ".join(
              f"{k} {v * 1e3:.2f} ms" for k, v in figures.items()))
  cache_read = cache_read_section(o, config, steps)
  beams = decoding_speed.beam_scaling(
      model, vocabulary, texts[:max(o.decode_batch_size, 64)],
      [int(k) for k in o.beam_sizes],
      batch_size=o.decode_batch_size, runs=o.runs)
  print("sentences/s against beam size: " + ", ".join(
      f"{k} {v:.1f}" for k, v in beams.items()))
  report["decode"] = {"saved_model": rows, "time_per_token": per_token,
                      "cache_read": cache_read,
                      "beam_scaling": beams,
                      "model": "random weights; outputs run to the length "
                               "limit (source tokens + 1)"}


def shortlist_section(o, config, report):
  """The shortlist's gain against the vocabulary's size: random weights
  and a random table (a synthetic micro-benchmark), outputs run to the
  limit."""
  # pylint: disable=g-import-not-at-top
  import keras
  from tf_transformer import build_model
  from bench import decoding_speed
  from tf_transformer.run import translator_flags
  k, n = translator_flags.parse_shortlist(o.serving_shortlist)
  columns = ["vocab_size", "full_sentences_per_sec",
             "shortlist_sentences_per_sec", "speedup", "shortlist_pieces"]
  _print_header(f"vocabulary shortlist {k},{n} against the vocabulary "
                "(synthetic: random weights and table; beam 4, batch "
                f"{o.decode_batch_size})", columns)
  rows = []
  for size in o.shortlist_vocab_sizes:
    vocabulary = decoding_speed.synthetic_vocabulary(int(size))
    keras.utils.set_random_seed(o.model_seed)
    model = build_model(config.replace(vocab_size=vocabulary.vocab_size))
    texts = decoding_speed.sentences(vocabulary, 2 * o.decode_batch_size,
                                     o.decode_words)
    rows.append(decoding_speed.shortlist_gain(
        model, vocabulary, texts, decoding_speed.random_shortlist(
            vocabulary.vocab_size, k, n), o.decode_batch_size, runs=o.runs))
    _print_rows(rows[-1:], columns)
  report["shortlist"] = {"rows": rows, "shortlist": [k, n],
                         "model": "random weights and table; outputs run "
                                  "to the length limit (source + 10)"}


def serving_section(o, report):
  # pylint: disable=g-import-not-at-top
  from bench import serving_speed
  from tf_transformer.data.corpora import read_lines
  from tf_transformer.run import translator_flags
  if not (o.model_dir and o.source):
    raise ValueError("--sections=serving needs --model_dir (a trained "
                         "run) and --source (real text)")
  sentences = read_lines(o.source)[:o.serving_sentences]
  references = (read_lines(o.reference)[:len(sentences)]
                if o.reference else None)
  settings = serving_speed.Settings(
      sentences, references, o.serving_batch_size,
      tuple(o.serving_orders), tuple(o.serving_searches),
      tuple(o.serving_decoders or serving_speed.DECODERS), o.threads,
      o.runs, 1, o.latency_sentences, clients=o.clients,
      profile_sentences=o.profile_sentences,
      shortlist=translator_flags.parse_shortlist(o.serving_shortlist))
  results, options = serving_speed.measure(
      o.model_dir, settings, log=lambda m: print(m, flush=True))
  figures = serving_speed.summarize(
      results, settings, os.path.join(o.model_dir, "vocabulary.model"))
  base = serving_speed.BASELINE
  columns = ["search", "order", "decoder", "sentences_per_second",
             f"sentences_per_second_vs_{base}", "sentences_per_cpu_second",
             f"sentences_per_cpu_second_vs_{base}",
             "output_tokens_per_second", "bleu", "identical_to_ours"]
  _print_header(f"serving {len(sentences)} lines of {o.source}, batch "
                f"{o.serving_batch_size}, {o.threads} threads (beam "
                f"{options.beam_size}, alpha {options.length_penalty_alpha})",
                columns)
  _print_rows(figures["throughput"], columns)
  columns = ["search", "decoder", "p50_ms", f"p50_ms_vs_{base}", "p90_ms",
             "cpu_ms", f"cpu_ms_vs_{base}"]
  _print_header(f"latency, one sentence per request ({o.latency_sentences}"
                " sentences; cpu_ms: median CPU time a request)", columns)
  _print_rows(figures["latency"], columns)
  if figures["concurrency"]:
    columns = ["search", "decoder", "clients", "sentences_per_second",
               f"sentences_per_second_vs_{base}", "p50_ms", "p99_ms"]
    _print_header(f"{o.clients} clients at once, one sentence a call, one "
                  "loaded model", columns)
    _print_rows(figures["concurrency"], columns)
  if figures["kernels"]:
    columns = ["search", "decoder", "batch", "kernels_per_step",
               "kernel_us_per_step", "steps_per_request", "other_kernels"]
    _print_header("kernels a decoding step executes (profiler trace)",
                  columns)
    _print_rows(figures["kernels"], columns)
  report["serving"] = {**figures,
                       "model_dir": o.model_dir, "source": o.source,
                       "sentences": len(sentences),
                       "decoding": dataclasses.asdict(options),
                       "ct2_patience": settings.ct2_patience,
                       # CTranslate2's float32 GEMM backend, per decoder
                       "ct2_gemm": {name: result["ct2_sgemm_backend"]
                                    for by in results.values()
                                    for name, result in by.items()
                                    if "ct2_sgemm_backend" in result},
                       "shortlist": settings.shortlist,
                       "outputs": {search: {
                           name: result["orders"][o.serving_orders[0]][
                               "outputs"] for name, result in by.items()}
                                   for search, by in results.items()}}


def litert_step_section(o, report):
  """The decoding step alone, TensorFlow (as the SavedModel runs it)
  against LiteRT float32 and int8 weights, one thread
  (`litert_step.py`)."""
  # pylint: disable=g-import-not-at-top
  import statistics
  from bench import serving_speed
  from tf_transformer.data.corpora import read_lines
  if not (o.model_dir and o.source):
    raise ValueError("--sections=litert_step needs --model_dir (a trained "
                     "run) and --source (real text)")
  rows = [int(r) for r in o.litert_step_rows]
  request = dict(model_dir=o.model_dir, rows=rows, steps=o.litert_steps,
                 group=4, runs=o.runs,
                 sentences=read_lines(o.source)[:max(rows) // 4])
  worker = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                        "litert_step.py")
  measured = serving_speed.run_worker(worker, request,
                                      what="litert_step worker")[0]["rows"]
  base = "tensorflow_float32"
  figures = []
  for count, by in measured.items():
    per_step = {name: 1000 * statistics.median(seconds) / o.litert_steps
                for name, seconds in by["cpu_seconds"].items()}
    for name, ms in per_step.items():
      ids = by["ids"][name]
      same = sum(a == b for a, b in zip(ids, by["ids"][base])) / len(ids)
      figures.append(dict(
          rows=int(count), engine=name, cpu_ms_per_step=ms,
          cpu_ms_per_step_vs_tensorflow_float32=ms / per_step[base],
          cpu_ms_runs=[1000 * s / o.litert_steps
                       for s in by["cpu_seconds"][name]],
          rows_identical_to_tensorflow_float32=same,
          file_mb=by["tflite_bytes"].get(name, 0) / 2**20 or None))
  columns = ["rows", "engine", "cpu_ms_per_step",
             "cpu_ms_per_step_vs_tensorflow_float32",
             "rows_identical_to_tensorflow_float32", "file_mb"]
  _print_header(f"the decoding step alone: {o.litert_steps} steps from BOS "
                f"on {o.model_dir}'s weights, the memory of {o.source}'s "
                "first lines, one thread; CPU ms a step, median of "
                f"{o.runs} turns", columns)
  _print_rows(figures, columns)
  report["litert_step"] = {"rows": figures, "model_dir": o.model_dir,
                           "source": o.source, "steps": o.litert_steps}


def cache_read_section(o, config, steps):
  """What reading the self-attention cache alone costs per output token, at
  the memory's speed and at the speed of attention's batched matmuls: the
  part of the time per token that grows with the output. The same for a
  bfloat16 cache, half the bytes, at the speed TensorFlow's bfloat16
  matmuls read it."""
  # pylint: disable=g-import-not-at-top
  from bench import decoding_speed, timing
  from tf_transformer.decoding.cache import BLOCK_LENGTH
  import tensorflow as tf
  speeds = {dtype: timing.read_bandwidth(
      o.bandwidth_megabytes, config.model.d_k, 4, 4 * BLOCK_LENGTH, o.runs,
      dtype, o.decode_batch_size * config.model.num_heads)
            for dtype in (tf.float32, tf.bfloat16)}
  for dtype, read in speeds.items():
    gb = lambda name, read=read: read[f"{name}_gb_per_sec"]
    print(f"reading {read['megabytes']:.0f} MB of {dtype.name}, GB/s: full "
          f"reduction {gb('reduction'):.1f}; attention's matmuls: Q K^T "
          f"{gb('scores_matmul'):.1f} (as K Q^T: "
          f"{gb('scores_matmul_keys_left'):.1f}; K stored transposed: "
          f"{gb('scores_matmul_transposed_keys'):.1f}), weights V "
          f"{gb('values_matmul'):.1f}")
  fp32, bf16 = speeds[tf.float32], speeds[tf.bfloat16]
  report = {"read_bandwidth": fp32, "read_bandwidth_bfloat16": bf16}
  for batch_size in sorted({1, o.decode_batch_size}):
    rows = 4 * batch_size
    figures = {
        "memory": decoding_speed.cache_read_per_token(
            config, rows, steps, fp32["reduction_gb_per_sec"]),
        "matmuls": decoding_speed.cache_read_per_token(
            config, rows, steps, fp32["scores_matmul_gb_per_sec"],
            fp32["values_matmul_gb_per_sec"]),
        "matmuls_bfloat16": decoding_speed.cache_read_per_token(
            config, rows, steps, bf16["scores_matmul_gb_per_sec"],
            bf16["values_matmul_gb_per_sec"], bytes_per_number=2)}
    report[f"batch_{batch_size}"] = {
        "bytes_per_position": decoding_speed.cache_bytes_per_position(
            config, rows), **figures}
    print(f"cache read per output token, batch {batch_size}, at the "
          f"memory's / the matmuls' speed (bfloat16 cache: half the bytes, "
          f"at its matmuls' speed): " + ", ".join(
              f"{k} {figures['memory'][k] * 1e3:.2f} / "
              f"{figures['matmuls'][k] * 1e3:.2f} "
              f"({figures['matmuls_bfloat16'][k] * 1e3:.2f}) ms"
              for k in figures["memory"]))
  return report


def run(o) -> dict:
  """Runs `o.sections` (o: the flag values of benchmark_flags), printing
  each figure as it comes; returns the report, also written to o.output."""
  from tf_transformer.training import strategy as strategy_lib  # pylint: disable=g-import-not-at-top
  if "mirrored" in o.train_variants and "train" in o.sections:
    strategy_lib.split_cpu(o.cpu_devices)  # before any op runs
  # pylint: disable=g-import-not-at-top
  from tf_transformer import config as config_lib
  from tf_transformer import cost
  from bench import timing
  import tensorflow as tf
  tf.get_logger().setLevel("ERROR")
  config = config_lib.get_config(o.config, o.hparams,
                                 vocab_size=o.vocab_size)
  report = {"machine": timing.machine(), "config": config.to_dict(),
            "flags": o.flags_text,
            "flops_per_token": cost.flops_per_token(config.model,
                                                    o.source_length),
            "parameters": cost.parameter_count(config.model)}
  start = time.time()
  m = report["machine"]
  print(f"{m['cpu']} ({m['cores']} cores, {', '.join(m['cpu_flags'])}), "
        f"TensorFlow {m['versions']['tensorflow']}, TF_ENABLE_ONEDNN_OPTS="
        f"{m['TF_ENABLE_ONEDNN_OPTS'] or 'unset'}")
  if "serving" in o.sections:
    serving_section(o, report)
  if "litert_step" in o.sections:
    litert_step_section(o, report)
  if "shortlist" in o.sections:
    shortlist_section(o, config, report)
  if "input" in o.sections:
    from bench import input_speed
    report["input"] = input_speed.measure(o)
    print("\n".join(input_speed.report_lines(report["input"])))
  if not {"train", "scaling", "decode"} & set(o.sections):
    return _write(o, report, start)
  print(f"{o.config} ({o.hparams or 'no overrides'}), vocabulary "
        f"{config.model.vocab_size}: {report['parameters']:,} parameters, "
        f"{report['flops_per_token']:,} forward FLOPs per token")
  peak = timing.matmul_peak(o.matmul_size, o.runs)
  report["matmul_peak"] = peak
  print(f"fp32 matmul {peak['n']}^3: TensorFlow "
        f"{peak['tensorflow_gflops']:.1f} GFLOP/s, numpy "
        f"{peak['numpy_gflops']:.1f} GFLOP/s (the MFU peak: TensorFlow's)")
  peak_gflops = peak["tensorflow_gflops"]
  if "train" in o.sections:
    train_section(o, config, report, peak_gflops)
  if "scaling" in o.sections:
    scaling_section(o, config, report, peak_gflops)
  if "decode" in o.sections:
    decode_section(o, config, report)
  return _write(o, report, start)


def _write(o, report, start):
  report["seconds"] = time.time() - start
  os.makedirs(os.path.dirname(os.path.abspath(o.output)), exist_ok=True)
  with open(o.output, "w", encoding="utf-8") as f:
    json.dump(report, f, indent=2)
  print(f"\nwrote {o.output} ({report['seconds']:.0f} s)")
  return report
