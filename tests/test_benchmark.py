"""bin/benchmark.py runs its sections on the tiny preset and writes a JSON
report with the machine, the flags and every figure. (Mechanics only: no
speed is asserted; figures come from running the command, see README.)"""

import json
import os
import subprocess
import sys

from conftest import run_script


def test_benchmark_writes_every_figure(tmp_path):
  output = tmp_path / "report.json"
  result = run_script(
      "benchmark.py", "--config=tiny", "--vocab_size=1000",
      "--sections=train,scaling,decode",
      "--train_variants=no_xla,mirrored", "--cpu_devices=2",
      "--batch_tokens=256", "--scaling_lengths=8", "--decode_sentences=8",
      "--decode_batch_size=4", "--token_steps=6,8", "--beam_sizes=1,2",
      "--runs=1", "--warmup=1", "--matmul_size=128", f"--output={output}")
  assert result.returncode == 0, result.stderr[-3000:]
  report = json.loads(output.read_text())
  machine = report["machine"]
  assert machine["cores"] >= 1 and machine["versions"]["tensorflow"]
  assert report["matmul_peak"]["tensorflow_gflops"] > 0
  assert report["parameters"] > 0 and report["flops_per_token"] > 0
  assert "--config=tiny" in report["flags"]
  variants = [row["variant"] for row in report["train"]]
  assert variants == ["no_xla", "mirrored_2cpu"]
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
