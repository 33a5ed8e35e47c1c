"""benchmarks/benchmark.py --sections=input: the training data path on a corpus of
`--input_pairs` pairs, measured as a user meets it on the paper's corpora.

The corpus (real text of WMT's lengths, rebuildable by anyone): pair i
joins two Multi30k training captions drawn by a seeded permutation, source
and target alike, so a pair has about 27 source and 25 target subwords, as
WMT 2014 English-German has (`build_corpus`; kept in `--input_dir` and
reused). Each step runs in a process of its own, whose anonymous memory
(RssAnon: not the page cache of memory-mapped arrays) is sampled while it
runs:

- prepare: `bin/prepare_data.py` (vocabulary, token arrays, statistics):
  wall seconds, and the tokenization's pairs/s a thread;
- start: `bin/train.py --train_steps=1` of the tiny model on the prepared
  directory (arrays linked into a fresh run), at `--input_step_batch_tokens`
  (one of the paper's 8 GPUs' share: a step's own tensors, such as its
  [tokens, vocabulary] logits, grow with the batch, not with the corpus):
  wall seconds from launch to exit, and the seconds its log shows from
  start to step 1;
- the pipeline (`input_worker`), from batch 0 and from mid-epoch (a
  resume): seconds to the first batch, real (non-pad) source + target
  tokens/s over `--input_batches` batches, a thread.
"""

import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time

import numpy as np

BENCHMARKS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(BENCHMARKS)


def build_corpus(multi30k_dir, pairs, directory, seed=0):
  """Writes `directory`/train.en and train.de, `pairs` lines each, from
  Multi30k's training captions (two joined a line); returns their paths.
  Kept if already there with that many lines."""
  paths = [os.path.join(directory, f"train.{l}") for l in ("en", "de")]
  done = os.path.join(directory, f"built_{pairs}_{seed}")
  if os.path.exists(done):
    return paths
  os.makedirs(directory, exist_ok=True)
  sides = []
  for language in ("en", "de"):
    with gzip.open(os.path.join(multi30k_dir, f"train.{language}.gz"),
                   "rt", encoding="utf-8") as f:
      sides.append(np.array(f.read().splitlines(), dtype=object))
  rng = np.random.default_rng(seed)
  n = len(sides[0])
  with open(paths[0], "w", encoding="utf-8") as en, open(
      paths[1], "w", encoding="utf-8") as de:
    for start in range(0, pairs, 100_000):
      count = min(100_000, pairs - start)
      a, b = rng.integers(0, n, count), rng.integers(0, n, count)
      for out, side in ((en, sides[0]), (de, sides[1])):
        out.write("\n".join(side[a] + " " + side[b]) + "\n")
  open(done, "w").close()
  return paths


def _run(command, env=None):
  """Runs `command`; returns (seconds, peak RssAnon MiB, stdout, stderr),
  sampling /proc/PID/status every 50 ms."""
  start = time.time()
  process = subprocess.Popen(command, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=REPO,
                             env=dict(os.environ, **(env or {})))
  peak = [0]

  def sample():
    while process.poll() is None:
      peak[0] = max(peak[0], rss_anon_mib(process.pid))
      time.sleep(0.05)
  sampler = threading.Thread(target=sample, daemon=True)
  sampler.start()
  out, err = process.communicate()
  seconds = time.time() - start
  sampler.join()
  if process.returncode:
    raise ValueError(f"{' '.join(command[:3])}... failed "
                     f"({process.returncode}): {err[-2000:]}")
  return seconds, peak[0], out, err


def rss_anon_mib(pid="self"):
  try:
    with open(f"/proc/{pid}/status") as f:
      for line in f:
        if line.startswith("RssAnon:"):
          return int(line.split()[1]) / 1024
  except OSError:
    pass
  return 0


def measure(o):
  """The section's figures (o: benchmarks/benchmark.py's flag values)."""
  corpus = os.path.join(o.input_dir, f"corpus_{o.input_pairs}")
  source, target = build_corpus(o.multi30k_dir, o.input_pairs, corpus)
  prepared = os.path.join(corpus, "prepared")
  figures = {"pairs": o.input_pairs, "cores": os.cpu_count()}
  python = sys.executable
  seconds, peak, _, _ = _run([
      python, "bin/prepare_data.py", "--dataset=", f"--train_source={source}",
      f"--train_target={target}", f"--output_dir={prepared}",
      f"--vocab_size={o.input_vocab_size}",
      f"--max_length={o.input_max_length}"])
  manifest = json.load(open(os.path.join(prepared, "train.tokens.json")))
  figures["prepare"] = {
      "seconds": seconds, "rss_anon_peak_mib": peak,
      "tokenize_seconds": manifest["tokenize_seconds"],
      "tokenize_pairs_per_sec_per_thread": manifest["pairs"] / manifest[
          "tokenize_seconds"] / manifest["threads"],
      "threads": manifest["threads"],
      "source_tokens_per_pair": manifest["source_tokens"] / manifest["pairs"],
      "target_tokens_per_pair": manifest["target_tokens"] / manifest["pairs"],
      "array_mib": sum(os.path.getsize(os.path.join(prepared, f"train.{n}.npy"))
                       for n in ("source", "target", "offsets")) / 2**20}
  figures["start"] = _train_start(o, prepared, source, target)
  for name, where in (("first_batch", "start"), ("resume", "middle")):
    _, peak, out, _ = _run([
        python, "-m", "bench.input_worker", prepared,
        str(o.input_batch_tokens), str(o.input_max_length), where,
        str(o.input_batches)], env={"PYTHONPATH": os.pathsep.join(
            filter(None, [BENCHMARKS, os.environ.get("PYTHONPATH")]))})
    figures[name] = dict(json.loads(out.strip().splitlines()[-1]),
                         rss_anon_peak_mib=peak)
  return figures


def _train_start(o, prepared, source, target):
  """bin/train.py's start on the prepared arrays, in a fresh run directory
  that links them (as if bin/prepare_data.py had written there)."""
  run = os.path.join(os.path.dirname(prepared), f"run_{time.time_ns()}")
  os.makedirs(run)
  for name in os.listdir(prepared):
    if name.startswith("train."):  # the arrays; the small files are copied
      os.symlink(os.path.join(prepared, name), os.path.join(run, name))
    else:
      shutil.copy(os.path.join(prepared, name), run)
  seconds, peak, _, err = _run([
      sys.executable, "bin/train.py", f"--model_dir={run}", "--dataset=",
      f"--train_source={source}", f"--train_target={target}",
      "--config=tiny", f"--max_length={o.input_max_length}",
      f"--batch_tokens={o.input_step_batch_tokens}", "--train_steps=1",
      "--eval_every_steps=0", "--checkpoint_every_secs=0",
      "--log_every_steps=1", "--alsologtostderr"])
  with open(os.path.join(run, "train_stderr.txt"), "w") as f:
    f.write(err)
  logged = [(_log_time(line), line) for line in err.splitlines()
            if _log_time(line) is not None]
  step = [t for t, line in logged if re.search(r"step 1/1 loss", line)]
  return {"seconds": seconds, "rss_anon_peak_mib": peak,
          "batch_tokens": o.input_step_batch_tokens, "log": f.name,
          "log_start_to_step_1": (step[0] - logged[0][0] if step else None)}


def _log_time(line):
  """Seconds of day of an absl log line (`I1125 10:40:01.123 ...`)."""
  match = re.match(r"[IWE](?!0000)\d{4} (\d\d):(\d\d):(\d\d\.\d+) ", line)
  if not match:
    return None
  h, m, s = match.groups()
  return int(h) * 3600 + int(m) * 60 + float(s)


def report_lines(figures):
  p, s = figures["prepare"], figures["start"]
  lines = [
      f"input: {figures['pairs']:,} pairs ({p['source_tokens_per_pair']:.1f} "
      f"source, {p['target_tokens_per_pair']:.1f} target subwords a pair), "
      f"{figures['cores']} cores",
      f"  prepare_data: {p['seconds']:.1f} s, tokenizing "
      f"{p['tokenize_seconds']:.1f} s = "
      f"{p['tokenize_pairs_per_sec_per_thread']:,.0f} pairs/s a thread on "
      f"{p['threads']}; arrays {p['array_mib']:.0f} MiB; peak RssAnon "
      f"{p['rss_anon_peak_mib']:.0f} MiB",
      f"  train.py --train_steps=1 (tiny, {s['batch_tokens']} tokens a "
      f"batch): {s['seconds']:.1f} s launch to "
      f"exit, {s['log_start_to_step_1'] or float('nan'):.1f} s from its "
      f"first log line to step 1; peak RssAnon {s['rss_anon_peak_mib']:.0f}"
      " MiB"]
  for name in ("first_batch", "resume"):
    f = figures[name]
    lines.append(
        f"  pipeline from {f['where']} (epoch batch {f['start_batch']} of "
        f"{f['batches_per_epoch']}): first batch {f['seconds_to_first']:.2f}"
        f" s ({f['plan_seconds']:.2f} s of it the epoch's plan); "
        f"{f['real_tokens_per_sec']:,.0f} real tokens/s over "
        f"{f['batches']} batches; RssAnon {f['rss_anon_before_mib']:.0f} -> "
        f"{f['rss_anon_after_mib']:.0f} MiB (peak {f['rss_anon_peak_mib']:.0f})")
  return lines
