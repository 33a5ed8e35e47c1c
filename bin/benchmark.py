#!/usr/bin/env python3
r"""Measures training and decoding speed on this machine; prints a table
and writes the figures, the machine, the versions and the flags as JSON.

  # serving a trained model on real text, beside CTranslate2 (the figures
  # docs/performance.md leads with; docs/recipes.md trains the model):
  bin/benchmark.py --sections=serving --model_dir=runs/multi30k/averaged \
      --source=runs/multi30k/data/test_2016_flickr.en \
      --reference=runs/multi30k/data/test_2016_flickr.de
  bin/benchmark.py --config=base --output=benchmark.json
  # the synthetic decoding micro-benchmark of docs/performance.md:
  bin/benchmark.py --config=base \
      --hparams=num_layers=3,d_model=256,d_ff=1024,num_heads=4 \
      --vocab_size=8000 --sections=decode --decode_sentences=1000

Sections (--sections):
- train: seconds per step and source+target tokens/s at --batch_tokens and
  --source_length, for the default (attention and loss under XLA), the loss
  without XLA, no XLA at all (also no_xla_attention), the whole step under XLA,
  bfloat16 mixed precision (also with the whole step under XLA), one device
  and MirroredStrategy over --cpu_devices; model FLOPs utilisation against a 4096^3 fp32 matmul timed
  here (model FLOPs: bin/model_summary.py's count, times 3).
- scaling: training tokens/s at source lengths 16, 64, 256.
- serving: the run --model_dir exported as bin/export.py does (default and
  --xla, each with oneDNN on and off; and --decode_parts=--threads served
  with one intra-op thread) and as CTranslate2 (float32, and int8
  quantized at load), each in a fresh process on the first
  --serving_sentences lines of --source: sentences/s and output tokens/s at
  --serving_batch_size in file order and sorted by length, latency (p50,
  p90) one sentence at a time, beam search and greedy; the ratio of each to
  CTranslate2 float32, BLEU against --reference, and the lines identical to
  the default SavedModel's. Not run by default: it needs a trained model.
- decode (a synthetic micro-benchmark: random weights, outputs forced to
  --decode_words + 1 tokens): a SavedModel exported like bin/export.py, beam 4 and greedy, at
  batch 1 and --decode_batch_size: sentences/s and output tokens/s; time per
  output token at steps 10, 50, 100; sentences/s for beams 1, 4, 8.
Warm-up runs are excluded; each figure is the median of --runs runs.
"""

import dataclasses
import json
import os
import time

from absl import app
from absl import flags
from absl import logging

from tf_transformer import command

FLAGS = flags.FLAGS
SECTIONS = ("train", "scaling", "decode", "serving")
flags.DEFINE_string("config", "base", "Model preset.")
flags.DEFINE_string("hparams", "", "Config overrides.")
flags.DEFINE_integer("vocab_size", 37000, "Vocabulary size of the model.")
flags.DEFINE_list("sections", ["train", "scaling", "decode"],
                  f"Any of {', '.join(SECTIONS)}.")
flags.DEFINE_string("model_dir", None, "serving: a trained run or an "
                    "averaged one.")
flags.DEFINE_string("source", None, "serving: source sentences, one per "
                    "line (real text, e.g. Multi30k's test_2016_flickr.en).")
flags.DEFINE_string("reference", None, "serving: references for BLEU.")
flags.DEFINE_integer("serving_sentences", 1000, "serving: lines of --source "
                     "decoded in each pass.")
flags.DEFINE_integer("serving_batch_size", 32, "serving: sentences per "
                     "request.")
flags.DEFINE_integer("latency_sentences", 100, "serving: sentences decoded "
                     "one at a time for the latency figures (0: none).")
flags.DEFINE_integer("threads", 2, "serving: CPU threads of each decoder.")
flags.DEFINE_list("serving_decoders", None, "serving: a subset of the "
                  "decoders (default: all).")
flags.DEFINE_list("serving_searches", ["beam", "greedy"], "serving: beam, "
                  "greedy or both.")
flags.DEFINE_list("serving_orders", ["file", "sorted"], "serving: file "
                  "order, length-sorted, or both.")
flags.DEFINE_integer("batch_tokens", 4096, "Tokens per side of a training "
                     "batch (the paper: 25000 over 8 GPUs).")
flags.DEFINE_integer("source_length", 32, "Sentence length of the training "
                     "batches (both sides).")
flags.DEFINE_list("scaling_lengths", ["16", "64", "256"], "Source lengths "
                  "of the scaling section.")
flags.DEFINE_list("train_variants", ["xla_attention", "no_xla_loss",
                                     "no_xla", "whole_step_xla", "bfloat16",
                                     "bfloat16_whole_step_xla", "mirrored"],
                  "Training variants to run.")
flags.DEFINE_integer("cpu_devices", 2, "Logical CPU devices for the "
                     "MirroredStrategy variant.")
flags.DEFINE_integer("runs", 3, "Timed runs per figure (median reported).")
flags.DEFINE_integer("warmup", 2, "Untimed runs before them.")
flags.DEFINE_integer("matmul_size", 4096, "n of the n^3 peak matmul.")
flags.DEFINE_integer("decode_sentences", 256, "Sentences per decoding run.")
flags.DEFINE_integer("decode_words", 7, "Words per decoded sentence (one "
                     "subword each, plus EOS: the output length).")
flags.DEFINE_integer("decode_batch_size", 32, "The larger decoding batch.")
flags.DEFINE_list("token_steps", ["10", "50", "100"], "Output lengths at "
                  "which the time per output token is measured.")
flags.DEFINE_integer("bandwidth_megabytes", 256, "Size of the tensor read "
                     "to measure how fast a decoding cache can be read "
                     "(more than the CPU's caches).")
flags.DEFINE_list("beam_sizes", ["1", "4", "8"], "Beam sizes compared.")
flags.DEFINE_integer("model_seed", 0, "Seed of the decoding model's random "
                     "weights, so that runs decode the same outputs.")
flags.DEFINE_string("output", "benchmark.json", "Where the JSON goes.")
flags.register_validator("sections", lambda s: set(s) <= set(SECTIONS),
                         f"--sections: each must be one of {SECTIONS}")
flags.register_validator("token_steps",
                         lambda steps: all(int(n) >= 6 for n in steps),
                         "--token_steps: each must be >= 6 (half of it, "
                         "minus the 2 source tokens, must leave an output)")


def _variants():
  from tf_transformer.benchmark.training_speed import Variant  # pylint: disable=g-import-not-at-top
  known = {"xla_attention": Variant("xla_attention"),
           "no_xla": Variant("no_xla", xla_attention=False, xla_loss=False),
           "no_xla_loss": Variant("no_xla_loss", xla_loss=False),
           "no_xla_attention": Variant("no_xla_attention",
                                       xla_attention=False),
           "whole_step_xla": Variant("whole_step_xla", jit_compile_step=True),
           "bfloat16": Variant("bfloat16", mixed_precision="bfloat16"),
           "bfloat16_whole_step_xla": Variant(
               "bfloat16_whole_step_xla", mixed_precision="bfloat16",
               jit_compile_step=True),
           "mirrored": Variant(f"mirrored_{FLAGS.cpu_devices}cpu",
                               devices=FLAGS.cpu_devices)}
  unknown = set(FLAGS.train_variants) - set(known)
  if unknown:
    raise app.UsageError(f"--train_variants: unknown {sorted(unknown)}; "
                         f"known: {sorted(known)}")
  return [known[name] for name in FLAGS.train_variants]


def _print_header(title, columns):
  print(f"\n{title}")
  print("  " + "  ".join(f"{c:>22}" for c in columns), flush=True)


def _print_rows(rows, columns):
  for row in rows:
    print("  " + "  ".join(
        f"{row.get(c, ''):>22.4g}" if isinstance(row.get(c), float)
        else f"{str(row.get(c, '')):>22}" for c in columns), flush=True)


def train_section(config, report, peak):
  from tf_transformer.benchmark import training_speed  # pylint: disable=g-import-not-at-top
  rows = []
  columns = ["variant", "seconds_per_step", "tokens_per_sec",
             "model_gflops_per_sec", "mfu"]
  _print_header(f"training: {FLAGS.batch_tokens} tokens a side, sentences "
                f"of {FLAGS.source_length}", columns)
  for variant in _variants():
    try:
      rows.append(training_speed.measure(
          config, variant, FLAGS.batch_tokens, FLAGS.source_length,
          FLAGS.runs, FLAGS.warmup, peak))
    except Exception as e:  # pylint: disable=broad-except
      # A variant this machine cannot run is reported, not fatal.
      rows.append({"variant": variant.name, "error": str(e)[:300]})
    _print_rows(rows[-1:], columns + ["error"])
  report["train"] = rows


def scaling_section(config, report, peak):
  from tf_transformer.benchmark import training_speed  # pylint: disable=g-import-not-at-top
  variant = training_speed.Variant("xla_attention")
  columns = ["length", "rows", "seconds_per_step", "tokens_per_sec", "mfu"]
  _print_header("training cost against sentence length", columns)
  rows = []
  for length in FLAGS.scaling_lengths:
    rows.append(training_speed.measure(config, variant, FLAGS.batch_tokens,
                                       int(length), FLAGS.runs, FLAGS.warmup,
                                       peak))
    _print_rows(rows[-1:], columns)
  report["scaling"] = rows


def decode_section(config, report):
  # pylint: disable=g-import-not-at-top
  import keras
  from tf_transformer import build_model
  from tf_transformer.benchmark import decoding_speed
  from tf_transformer.decoding.search import DecodingOptions
  vocabulary = decoding_speed.synthetic_vocabulary(config.vocab_size)
  config = config.replace(vocab_size=vocabulary.vocab_size)
  keras.utils.set_random_seed(FLAGS.model_seed)
  model = build_model(config)
  texts = decoding_speed.sentences(vocabulary, FLAGS.decode_sentences,
                                   FLAGS.decode_words)
  rows = []
  columns = ["search", "batch_size", "sentences_per_sec",
             "output_tokens_per_sec", "output_tokens_per_sentence"]
  _print_header("decoding (exported SavedModel, text in and out)", columns)
  for method in ("beam", "greedy"):
    path = decoding_speed.export_model(model, vocabulary, DecodingOptions(
        method=method, max_length_offset=1))
    for batch_size in sorted({1, FLAGS.decode_batch_size}):
      # Batch 1 over every sentence would take long: 1/8 of them.
      subset = texts if batch_size > 1 else texts[:max(
          8, len(texts) // 8)]
      row = decoding_speed.measure_saved_model(path, vocabulary, subset,
                                               batch_size, FLAGS.runs)
      rows.append({"search": "beam 4" if method == "beam" else "greedy",
                   **row})
      _print_rows(rows[-1:], columns)
  per_token = {}
  print()
  steps = [int(n) for n in FLAGS.token_steps]
  for batch_size in sorted({1, FLAGS.decode_batch_size}):
    figures = decoding_speed.time_per_token(
        model, vocabulary, steps, batch_size=batch_size, runs=FLAGS.runs)
    per_token[f"batch_{batch_size}"] = figures
    print(f"beam 4 decode time per output token, batch {batch_size}: "
          + ", ".join(
              f"{k} {v * 1e3:.2f} ms" for k, v in figures.items()))
  cache_read = cache_read_section(config, steps)
  beams = decoding_speed.beam_scaling(
      model, vocabulary, texts[:max(FLAGS.decode_batch_size, 64)],
      [int(k) for k in FLAGS.beam_sizes],
      batch_size=FLAGS.decode_batch_size, runs=FLAGS.runs)
  print("sentences/s against beam size: " + ", ".join(
      f"{k} {v:.1f}" for k, v in beams.items()))
  report["decode"] = {"saved_model": rows, "time_per_token": per_token,
                      "cache_read": cache_read,
                      "beam_scaling": beams,
                      "model": "random weights; outputs run to the length "
                               "limit (source tokens + 1)"}


def serving_section(report):
  # pylint: disable=g-import-not-at-top
  from tf_transformer.benchmark import serving_speed
  from tf_transformer.data.corpora import read_lines
  if not (FLAGS.model_dir and FLAGS.source):
    raise app.UsageError("--sections=serving needs --model_dir (a trained "
                         "run) and --source (real text)")
  sentences = read_lines(FLAGS.source)[:FLAGS.serving_sentences]
  references = (read_lines(FLAGS.reference)[:len(sentences)]
                if FLAGS.reference else None)
  settings = serving_speed.Settings(
      sentences, references, FLAGS.serving_batch_size,
      tuple(FLAGS.serving_orders), tuple(FLAGS.serving_searches),
      tuple(FLAGS.serving_decoders or serving_speed.DECODERS), FLAGS.threads,
      FLAGS.runs, 1, FLAGS.latency_sentences)
  results, options = serving_speed.measure(
      FLAGS.model_dir, settings, log=lambda m: print(m, flush=True))
  throughput, latency = serving_speed.summarize(
      results, settings, os.path.join(FLAGS.model_dir, "vocabulary.model"))
  base = serving_speed.BASELINE
  columns = ["search", "order", "decoder", "sentences_per_second",
             f"sentences_per_second_vs_{base}", "output_tokens_per_second",
             "bleu", "identical_to_ours"]
  _print_header(f"serving {len(sentences)} lines of {FLAGS.source}, batch "
                f"{FLAGS.serving_batch_size}, {FLAGS.threads} threads (beam "
                f"{options.beam_size}, alpha {options.alpha})", columns)
  _print_rows(throughput, columns)
  columns = ["search", "decoder", "p50_ms", f"p50_ms_vs_{base}", "p90_ms"]
  _print_header(f"latency, one sentence per request ({FLAGS.latency_sentences}"
                " sentences)", columns)
  _print_rows(latency, columns)
  report["serving"] = {"throughput": throughput, "latency": latency,
                       "model_dir": FLAGS.model_dir, "source": FLAGS.source,
                       "sentences": len(sentences),
                       "decoding": dataclasses.asdict(options),
                       "ct2_patience": settings.ct2_patience,
                       "outputs": {search: {
                           name: result["orders"][FLAGS.serving_orders[0]][
                               "outputs"] for name, result in by.items()}
                                   for search, by in results.items()}}


def cache_read_section(config, steps):
  """What reading the self-attention cache alone costs per output token, at
  the memory's speed and at the speed of attention's batched matmuls: the
  part of the time per token that grows with the output. The same for a
  bfloat16 cache, half the bytes, at the speed TensorFlow's bfloat16
  matmuls read it."""
  # pylint: disable=g-import-not-at-top
  from tf_transformer.benchmark import decoding_speed, timing
  from tf_transformer.layers.decoding_cache import BLOCK_LENGTH
  import tensorflow as tf
  speeds = {dtype: timing.read_bandwidth(
      FLAGS.bandwidth_megabytes, config.d_k, 4, 4 * BLOCK_LENGTH, FLAGS.runs,
      dtype, FLAGS.decode_batch_size * config.num_heads)
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
  for batch_size in sorted({1, FLAGS.decode_batch_size}):
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


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # the figures, not TF's chatter
  from tf_transformer.training import strategy as strategy_lib  # pylint: disable=g-import-not-at-top
  if "mirrored" in FLAGS.train_variants and "train" in FLAGS.sections:
    strategy_lib.split_cpu(FLAGS.cpu_devices)  # before any op runs
  # pylint: disable=g-import-not-at-top
  from tf_transformer import config as config_lib
  from tf_transformer import cost
  from tf_transformer.benchmark import timing
  import tensorflow as tf
  tf.get_logger().setLevel("ERROR")
  config = config_lib.get_config(FLAGS.config, FLAGS.hparams,
                                 vocab_size=FLAGS.vocab_size)
  report = {"machine": timing.machine(), "config": config.to_dict(),
            "flags": FLAGS.flags_into_string(),
            "flops_per_token": cost.flops_per_token(config,
                                                    FLAGS.source_length),
            "parameters": cost.parameter_count(config)}
  start = time.time()
  m = report["machine"]
  print(f"{m['cpu']} ({m['cores']} cores, {', '.join(m['cpu_flags'])}), "
        f"TensorFlow {m['versions']['tensorflow']}, TF_ENABLE_ONEDNN_OPTS="
        f"{m['TF_ENABLE_ONEDNN_OPTS'] or 'unset'}")
  if "serving" in FLAGS.sections:
    serving_section(report)
  if not {"train", "scaling", "decode"} & set(FLAGS.sections):
    return _write(report, start)
  print(f"{FLAGS.config} ({FLAGS.hparams or 'no overrides'}), vocabulary "
        f"{config.vocab_size}: {report['parameters']:,} parameters, "
        f"{report['flops_per_token']:,} forward FLOPs per token")
  peak = timing.matmul_peak(FLAGS.matmul_size, FLAGS.runs)
  report["matmul_peak"] = peak
  print(f"fp32 matmul {peak['n']}^3: TensorFlow "
        f"{peak['tensorflow_gflops']:.1f} GFLOP/s, numpy "
        f"{peak['numpy_gflops']:.1f} GFLOP/s (the MFU peak: TensorFlow's)")
  peak_gflops = peak["tensorflow_gflops"]
  if "train" in FLAGS.sections:
    train_section(config, report, peak_gflops)
  if "scaling" in FLAGS.sections:
    scaling_section(config, report, peak_gflops)
  if "decode" in FLAGS.sections:
    decode_section(config, report)
  return _write(report, start)


def _write(report, start):
  report["seconds"] = time.time() - start
  os.makedirs(os.path.dirname(os.path.abspath(FLAGS.output)), exist_ok=True)
  with open(FLAGS.output, "w", encoding="utf-8") as f:
    json.dump(report, f, indent=2)
  print(f"\nwrote {FLAGS.output} ({report['seconds']:.0f} s)")
  return 0


if __name__ == "__main__":
  command.run(main)
