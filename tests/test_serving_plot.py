"""benchmarks/plot_serving.py: each beam decoder of each serving report a
point, its CPU time from the latency rows and its BLEU from the
throughput rows of the same decoder."""

import json

from conftest import run_script


def _report(path, rows):
  """A serving section as benchmark.py writes it: (decoder, beam BLEU,
  greedy BLEU, beam CPU ms) a row."""
  throughput, latency = [], []
  for decoder, beam, greedy, cpu_ms in rows:
    throughput += [{"search": "beam", "decoder": decoder, "bleu": beam},
                   {"search": "greedy", "decoder": decoder, "bleu": greedy}]
    latency.append({"search": "beam", "decoder": decoder, "cpu_ms": cpu_ms})
  latency.append({"search": "greedy", "decoder": rows[0][0], "cpu_ms": 0.5})
  path.write_text(json.dumps({"serving": {"throughput": throughput,
                                          "latency": latency,
                                          "shortlist": [50, 300]}}))
  return str(path)


def test_plots_bleu_against_cpu_ms_for_each_beam_decoder(tmp_path):
  teacher = _report(tmp_path / "t.json", [("savedmodel", 38.0, 37.0, 32.4),
                                          ("ct2_int8", 38.1, 37.5, 6.6)])
  student = _report(tmp_path / "s.json", [
      ("savedmodel_bfloat16_shortlist", 37.9, 37.3, 9.2)])
  output = tmp_path / "plot.png"
  result = run_script("benchmarks/plot_serving.py",
                      f"--reports={teacher},{student}",
                      "--labels=teacher,student", f"--output={output}")
  assert result.returncode == 0, result.stderr[-2000:]
  lines = [line.split() for line in result.stdout.splitlines()
           if "BLEU" in line]
  assert lines == [
      ["teacher", "savedmodel", "greedy", "0.5", "ms", "BLEU", "37.00"],
      ["teacher", "ct2_int8", "6.6", "ms", "BLEU", "38.10"],
      ["teacher", "savedmodel", "32.4", "ms", "BLEU", "38.00"],
      ["student", "savedmodel_bfloat16_shortlist", "50,300", "greedy", "0.5",
       "ms", "BLEU", "37.30"],
      ["student", "savedmodel_bfloat16_shortlist", "50,300", "9.2", "ms",
       "BLEU", "37.90"]]
  assert output.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  refused = run_script("benchmarks/plot_serving.py", f"--reports={teacher}",
                       "--labels=teacher,student", f"--output={output}")
  assert refused.returncode != 0
  assert "--labels: 2 names for 1 --reports" in refused.stderr
