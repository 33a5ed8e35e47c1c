"""benchmarks/benchmark.py runs its sections on the tiny preset and writes a JSON
report with the machine, the flags and every figure. (Mechanics only: no
speed is asserted; figures come from running the command, see docs/performance.md.)"""

import json
import os
import subprocess
import sys

import pytest
import sentencepiece as spm
import tensorflow as tf
from tensorflow.python.util import _pywrap_utils

from conftest import run_script
import search_reference
from tf_transformer.run import run_dir
from tf_transformer.special_ids import EOS_ID
from tf_transformer import get_config
from bench import compiled_step, decoding_speed, timing
from bench import serving_speed

# Slow (README.md's quick tier leaves it out): the measuring tools, run as
# commands.
pytestmark = pytest.mark.slow


def test_benchmark_writes_every_figure(tmp_path):
  output = tmp_path / "report.json"
  # The command's TMPDIR: left empty at the end, with Python writing
  # bytecode as it does by default (where TensorFlow's AutoGraph imports a
  # module from TMPDIR, it would leave its __pycache__ there).
  scratch = tmp_path / "tmp"
  scratch.mkdir()
  result = run_script(
      "benchmarks/benchmark.py", "--config=tiny", "--vocab_size=1000",
      "--sections=train,scaling,decode",
      "--train_variants=no_xla_loss,mirrored", "--cpu_devices=2",
      "--batch_tokens=256", "--scaling_lengths=8", "--decode_sentences=8",
      "--decode_batch_size=4", "--token_steps=6,8", "--beam_sizes=1,2",
      "--runs=1", "--warmup=1", "--matmul_size=128", "--bandwidth_megabytes=4",
      f"--output={output}",
      env={"TMPDIR": str(scratch), "PYTHONDONTWRITEBYTECODE": ""})
  assert result.returncode == 0, result.stderr[-3000:]
  assert not list(scratch.iterdir()), "left behind in TMPDIR"
  report = json.loads(output.read_text())
  machine = report["machine"]
  assert machine["cores"] >= 1 and machine["versions"]["tensorflow"]
  assert report["matmul_peak"]["tensorflow_gflops"] > 0
  assert report["parameters"] > 0 and report["flops_per_token"] > 0
  assert "--config=tiny" in report["flags"]
  variants = [row["variant"] for row in report["train"]]
  assert variants == ["no_xla_loss", "mirrored_2cpu"]
  for row in report["train"] + report["scaling"]:
    assert "error" not in row, row
    assert row["seconds_per_step"] > 0 and row["tokens_per_sec"] > 0
    assert 0 < row["mfu"]
  assert [row["length"] for row in report["scaling"]] == [8]
  decode = report["decode"]
  searches = {(r["search"], r["batch_size"]) for r in decode["saved_model"]}
  assert searches == {("beam 4", 1), ("beam 4", 4), ("greedy", 1),
                      ("greedy", 4)}
  for row in decode["saved_model"]:
    # 7 one-subword words + EOS, and one more token allowed: 9 each.
    assert row["output_tokens_per_sentence"] == 9
    assert row["sentences_per_sec"] > 0
  per_token = decode["time_per_token"]
  assert set(per_token) == {"batch_1", "batch_4"}
  for figures in per_token.values():
    assert set(figures) == {"step_6", "step_8"}
  assert set(decode["beam_scaling"]) == {"beam_1", "beam_2"}
  cache_read = decode["cache_read"]
  for key, dtype in (("read_bandwidth", "float32"),
                     ("read_bandwidth_bfloat16", "bfloat16")):
    speeds = cache_read[key]
    assert speeds["dtype"] == dtype and speeds["megabytes"] > 0
    for name in ("reduction", "scores_matmul", "scores_matmul_keys_left",
                 "scores_matmul_transposed_keys", "values_matmul"):
      assert speeds[f"{name}_gb_per_sec"] > 0
  for batch_size in (1, 4):
    figures = cache_read[f"batch_{batch_size}"]
    # tiny: 2 layers x 4 heads x (d_k + d_v = 2 x 16) x 4 bytes x 4 beams
    assert figures["bytes_per_position"] == 2 * 4 * 32 * 4 * 4 * batch_size
    for speed in ("memory", "matmuls", "matmuls_bfloat16"):
      assert set(figures[speed]) == {"step_6", "step_8"}
      assert figures[speed]["step_8"] > 0
  assert "model_gflops_per_sec" in result.stdout and "wrote" in result.stdout


def test_onednn_is_on_unless_turned_off():
  code = ("import os, tf_transformer; "
          "print(os.environ['TF_ENABLE_ONEDNN_OPTS'])")
  for given, expected in ((None, "1"), ("0", "0")):
    env = {k: v for k, v in os.environ.items()
           if k != "TF_ENABLE_ONEDNN_OPTS"}
    if given is not None:
      env["TF_ENABLE_ONEDNN_OPTS"] = given
    out = subprocess.run([sys.executable, "-c", code], env=env, text=True,
                         capture_output=True, check=True).stdout
    assert out.strip() == expected


def test_cache_read_per_token_counts_the_whole_blocks_each_step_reads():
  """base, 32 sentences x 4 beams: each position adds 6 layers x 8 heads x
  (64 + 64) x 4 bytes x 128 rows; steps 50..99 read, in whole blocks of 16,
  64 (14 steps), 80 (16), 96 (16) and 112 (4) positions: 83.2 on average."""
  config = get_config("base")
  per_position = decoding_speed.cache_bytes_per_position(config, rows=128)
  assert per_position == 6 * 8 * 128 * 4 * 128 == 3_145_728
  figures = decoding_speed.cache_read_per_token(config, 128, [100, 10], 10.0)
  assert figures["step_100"] == pytest.approx(per_position * 83.2 / 10e9)
  # steps 5..9 all read the first block
  assert figures["step_10"] == pytest.approx(per_position * 16 / 10e9)
  # keys and values (half the bytes each) at their own speeds
  split = decoding_speed.cache_read_per_token(config, 128, [100], 10.0, 40.0)
  assert split["step_100"] == pytest.approx(
      per_position / 2 * 83.2 * (1 / 10e9 + 1 / 40e9))
  # a bfloat16 cache: half the bytes
  half = decoding_speed.cache_read_per_token(config, 128, [100], 10.0,
                                             bytes_per_number=2)
  assert half["step_100"] == pytest.approx(figures["step_100"] / 2)


def test_read_bandwidth_survives_a_single_sentence_head():
  """One sentence of one head would give K Q^T a size-1 batch axis against
  a broadcast query, which TensorFlow 2.21's oneDNN batched matmul crashes
  on; the measurement keeps two."""
  speeds = timing.read_bandwidth(megabytes=1, depth=16, group=4,
                                 block_rows=64, runs=1, sentence_heads=1)
  assert speeds["dtype"] == "float32" and speeds["megabytes"] > 0.5
  assert all(v > 0 for k, v in speeds.items() if k.endswith("_gb_per_sec"))


def test_compiled_step_times_three_ways_that_compute_the_same_logits():
  """benchmarks/compiled_step.py's figures (no speed asserted): each way
  timed at each batch size, and the static and XLA steps' logits those of
  the graph step within float32 rounding (tiny's logits are of order 1)."""
  config = get_config("tiny", vocab_size=300)
  figures = compiled_step.measure(config, [1, 2], group=2, steps=3,
                                  max_length=16, runs=1, rounds=1)
  for batch in ("batch_1", "batch_2"):
    assert set(figures[batch]) == {"graph", "static", "xla"}
    assert figures[batch]["graph"]["vs_graph"] == 1
    assert all(f["cpu_ms_per_step"] > 0 for f in figures[batch].values())
  differences = figures["max_abs_diff"]
  assert differences["graph"] == 0
  assert differences["static"] < 1e-5 and differences["xla"] < 1e-4


def test_help_exits_0_and_lists_the_flags():
  result = run_script("benchmarks/benchmark.py", "--help")
  assert result.returncode == 0
  assert "\n  --decode_words:" in result.stdout


# TensorFlow's own test of the CPU (tensorflow/core/util/util.cc), which its
# bfloat16 fusion tests use too.
ONEDNN_BFLOAT16 = _pywrap_utils.IsDataTypeSupportedByOneDNNOnThisCPU(
    tf.bfloat16.as_datatype_enum)


def test_serving_section_compares_exports_with_ctranslate2(
    trained_numbers_run, tmp_path):
  from tf_transformer.data import numbers  # pylint: disable=g-import-not-at-top
  pairs = numbers.generate({"test": 12}, seed=11)["test"]
  source, reference = tmp_path / "source.txt", tmp_path / "reference.txt"
  source.write_text("".join(s + "\n" for s, _ in pairs))
  reference.write_text("".join(t + "\n" for _, t in pairs))
  output = tmp_path / "serving.json"
  result = run_script(
      "benchmarks/benchmark.py", "--sections=serving", f"--model_dir={trained_numbers_run}",
      f"--source={source}", f"--reference={reference}",
      "--serving_decoders=savedmodel,savedmodel_parts,savedmodel_bfloat16,"
      "ct2_float32",
      "--serving_searches=beam", "--serving_batch_size=4",
      "--latency_sentences=3", "--runs=2", "--clients=2",
      "--profile_sentences=2", f"--output={output}")
  assert result.returncode == 0, result.stderr[-3000:]
  serving = json.loads(output.read_text())["serving"]
  rows = {(r["order"], r["decoder"]): r for r in serving["throughput"]}
  assert set(rows) == {(order, decoder) for order in ("file", "sorted")
                       for decoder in ("savedmodel", "savedmodel_parts",
                                       "savedmodel_bfloat16", "ct2_float32")}
  for row in rows.values():
    assert len(row["seconds"]) == 2 and row["sentences_per_second"] > 0
    assert row["sentences_per_cpu_second"] > 0
    assert row["output_tokens_per_second"] > row["sentences_per_second"]
    assert 0 <= row["bleu"] <= 100
  assert rows["file", "ct2_float32"]["sentences_per_second_vs_ct2_float32"] == 1
  assert set(serving["ct2_gemm"]) == {"ct2_float32"}
  for row in rows.values():
    unlike = row["lines_unlike_ours"]
    assert row["identical_to_ours"] == 1 - len(unlike) / len(pairs)
    assert set(unlike) <= set(range(len(pairs)))
  assert rows["file", "savedmodel"]["lines_unlike_ours"] == []
  # The same search, batched otherwise (and in parts): apart only where
  # float32 rounding can tip a decision. (CTranslate2's search has other
  # rules, and bfloat16 other rounding: tests/test_ct2_export.py,
  # tests/test_model_policy.py.)
  model, vocab = run_dir.load_trained_model(str(trained_numbers_run))
  processor = spm.SentencePieceProcessor(model_proto=vocab.model_proto)
  sources = [ids + [EOS_ID] for ids in processor.encode([s for s, _ in pairs])]
  for order, decoder in (("sorted", "savedmodel"), ("file", "savedmodel_parts"),
                         ("sorted", "savedmodel_parts")):
    search_reference.assert_near_ties(
        model, sources, rows[order, decoder]["lines_unlike_ours"],
        alpha=model.config.decoding.length_penalty_alpha,
        max_length_offset=model.config.decoding.max_decode_length_offset)
  latency = {r["decoder"]: r for r in serving["latency"]}
  assert latency["ct2_float32"]["p50_ms_vs_ct2_float32"] == 1
  assert all(r["sentences"] == 3 and r["p90_ms"] >= r["p50_ms"] > 0
             and r["cpu_ms"] > 0 for r in latency.values())
  concurrency = {r["decoder"]: r for r in serving["concurrency"]}
  assert set(concurrency) == set(latency)
  assert all(r["clients"] == 2 and r["sentences_per_second"] > 0
             and r["p99_ms"] >= r["p50_ms"] > 0 for r in concurrency.values())
  # Kernels a step, for each SavedModel (CTranslate2 has no TF trace).
  kernels = {(r["decoder"], r["batch"]): r for r in serving["kernels"]}
  assert set(kernels) == {(d, b) for d in ("savedmodel", "savedmodel_parts",
                                           "savedmodel_bfloat16")
                          for b in ("batch_1", "batch_4")}
  for (decoder, _), row in kernels.items():
    assert row["steps"] > 0 and 50 < row["kernels_per_step"] < 1000
    executed = set(row["by_type"])
    if decoder.endswith("bfloat16") and not ONEDNN_BFLOAT16:
      # Grappler fuses a bfloat16 MatMul + BiasAdd only where oneDNN runs
      # bfloat16 (AVX512F or AVX_NE_CONVERT); elsewhere, as on an AVX2-only
      # CPU, the step's matmuls run as plain MatMul kernels.
      assert "MatMul" in executed, sorted(executed)
    else:
      assert {"_FusedMatMul", "_MklNativeFusedMatMul"} & executed, sorted(
          executed)
  assert "sentences_per_second_vs_ct2_float32" in result.stdout


def test_shortlist_section_times_both_searches(tmp_path):
  output = tmp_path / "shortlist.json"
  result = run_script(
      "benchmarks/benchmark.py", "--sections=shortlist", "--config=tiny",
      "--shortlist_vocab_sizes=1000", "--serving_shortlist=3,20",
      "--decode_batch_size=4", "--decode_words=3", "--runs=1",
      f"--output={output}")
  assert result.returncode == 0, result.stderr[-3000:]
  (row,) = json.loads(output.read_text())["shortlist"]["rows"]
  assert row["full_sentences_per_sec"] > 0
  assert row["shortlist_sentences_per_sec"] > 0
  assert row["speedup"] == pytest.approx(
      row["shortlist_sentences_per_sec"] / row["full_sentences_per_sec"])
  # 4 special + 20 fixed pieces, and at most 3 for each distinct source
  # piece of a batch (4 sentences of 3 one-piece words, their EOS, PAD).
  assert 24 <= row["shortlist_pieces"] <= min(24 + 3 * (4 * 3 + 2),
                                              row["vocab_size"])
  assert "speedup" in result.stdout


def test_litert_step_section_times_the_step_in_both_runtimes(
    trained_numbers_run, tmp_path):
  """The step alone in TensorFlow (float32, bfloat16) and converted to
  LiteRT (float32, int8 weights), at each --litert_step_rows, each engine's
  turns timed; the int8 file holds a quarter of the float32 file's matrix
  bytes and more (its float32 biases, norms and graph)."""
  from tf_transformer.data import numbers  # pylint: disable=g-import-not-at-top
  source = tmp_path / "source.txt"
  source.write_text("".join(
      s + "\n" for s, _ in numbers.generate({"test": 2}, seed=5)["test"]))
  output = tmp_path / "litert.json"
  result = run_script(
      "benchmarks/benchmark.py", "--sections=litert_step",
      f"--model_dir={trained_numbers_run}", f"--source={source}",
      "--litert_step_rows=4,8", "--litert_steps=6", "--runs=2",
      f"--output={output}")
  assert result.returncode == 0, result.stderr[-3000:]
  rows = json.loads(output.read_text())["litert_step"]["rows"]
  engines = {"tensorflow_float32", "tensorflow_bfloat16", "litert_float32",
             "litert_int8"}
  for count in (4, 8):
    by = {r["engine"]: r for r in rows if r["rows"] == count}
    assert set(by) == engines, by
    for row in by.values():
      assert len(row["cpu_ms_runs"]) == 2 and row["cpu_ms_per_step"] > 0
      assert 0 <= row["rows_identical_to_tensorflow_float32"] <= 1
    assert by["tensorflow_float32"][
        "cpu_ms_per_step_vs_tensorflow_float32"] == 1
    assert 0 < by["litert_int8"]["file_mb"] < by["litert_float32"]["file_mb"]
  assert "cpu_ms_per_step" in result.stdout


def test_each_worker_starts_with_its_librarys_switches():
  """oneDNN's rewrites for a SavedModel, CTranslate2's MKL for its peer:
  read at load, so set in the worker's environment."""
  env = {name: serving_speed.worker_env(decoder)
         for name, decoder in serving_speed.DECODERS.items()}
  assert env["savedmodel"] == {"TF_ENABLE_ONEDNN_OPTS": "1"}
  assert env["savedmodel_no_onednn"] == {"TF_ENABLE_ONEDNN_OPTS": "0"}
  assert env["ct2_float32"] == {"CT2_VERBOSE": "1"}
  assert env["ct2_float32_no_mkl"] == {"CT2_VERBOSE": "1", "CT2_USE_MKL": "0"}


def test_serving_section_needs_a_model_and_text():
  result = run_script("benchmarks/benchmark.py", "--sections=serving")
  assert result.returncode != 0
  assert "--sections=serving needs --model_dir" in result.stderr


def test_input_section_measures_the_data_path(tmp_path):
  """--sections=input on a small corpus built from gzipped captions
  (Multi30k's layout; the numbers task's text stands in for them)."""
  import gzip  # pylint: disable=g-import-not-at-top
  from tf_transformer.data import numbers  # pylint: disable=g-import-not-at-top
  captions = tmp_path / "multi30k"
  captions.mkdir()
  pairs = numbers.generate({"train": 500, "dev": 1, "test": 1})["train"]
  for side, language in ((0, "en"), (1, "de")):
    with gzip.open(captions / f"train.{language}.gz", "wt") as f:
      f.write("".join(pair[side] + "\n" for pair in pairs))
  output = tmp_path / "report.json"
  result = run_script(
      "benchmarks/benchmark.py", "--sections=input", "--input_pairs=3000",
      f"--multi30k_dir={captions}", f"--input_dir={tmp_path / 'input'}",
      "--input_vocab_size=400", "--input_max_length=64",
      "--input_batch_tokens=1024", "--input_step_batch_tokens=512",
      "--input_batches=5", f"--output={output}")
  assert result.returncode == 0, result.stderr[-3000:]
  report = json.loads(output.read_text())["input"]
  assert report["pairs"] == 3000
  lines = (tmp_path / "input" / "corpus_3000" / "train.en").read_text(
      ).splitlines()
  assert len(lines) == 3000
  assert all(any(line.startswith(p[0] + " ") for p in pairs)
             for line in lines[:20])  # two captions a line
  prepare = report["prepare"]
  assert prepare["tokenize_pairs_per_sec_per_thread"] > 0
  assert prepare["source_tokens_per_pair"] > 2 and prepare["array_mib"] > 0
  assert report["start"]["log_start_to_step_1"] > 0
  assert report["start"]["rss_anon_peak_mib"] > 0
  for name, start in (("first_batch", 0), ("resume", None)):
    figures = report[name]
    assert figures["seconds_to_first"] > 0
    assert figures["real_tokens_per_sec"] > 0
    assert figures["start_batch"] == (
        start if start is not None else figures["batches_per_epoch"] // 2)
  assert report["resume"]["start_batch"] > 0
  assert "pipeline from middle" in result.stdout


def test_kernel_trace_counts_the_kernels_of_each_loop_step(tmp_path):
  """A loop of 5 steps, each a fusable MatMul + BiasAdd and an add: the
  trace gives 5 steps and the executed (fused) kernels of one step."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from bench import kernel_trace  # pylint: disable=g-import-not-at-top
  kernel, bias = tf.ones([8, 8]), tf.ones([8])

  @tf.function
  def loop(x):
    return tf.while_loop(
        lambda i, x: i < 5,
        lambda i, x: (i + 1, tf.nn.bias_add(tf.matmul(x, kernel), bias) * 0.5),
        (0, x))[1]
  loop(tf.ones([2, 8]))
  kernel_trace.trace(lambda: loop(tf.ones([2, 8])), str(tmp_path))
  counts = kernel_trace.step_counts(
      kernel_trace.executed_kernels(str(tmp_path)))
  assert counts["steps"] == 5
  fused = {"_FusedMatMul", "_MklNativeFusedMatMul", "_MklFusedMatMul"}
  assert sum(counts["by_type"].get(t, 0) for t in fused) == 1
  assert "BiasAdd" not in counts["by_type"]
  assert 2 <= counts["kernels_per_step"] < 8
