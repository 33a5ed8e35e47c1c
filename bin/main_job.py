#!/usr/bin/env python3
"""The main job, end to end on the embedded `numbers` task, with the
repository's own commands: prepare the data, train, average the last
checkpoints, export a SavedModel for TF Serving, score dev and test through
it, and translate examples through it next to their references.

  bin/main_job.py                        # about 5 minutes on 2 CPU cores

Each stage runs a bin/ script (its command is printed first, so any stage
can be rerun by hand) and the job ends with a summary. Run it again and the
finished training is reused (a killed one resumes from its last
checkpoint); each run exports the next version of --export_dir.
"""

import os
import re
import shlex
import subprocess
import sys
import time

from absl import app
from absl import flags

FLAGS = flags.FLAGS
flags.DEFINE_string("work_dir", "runs/numbers", "Run directory, averaged "
                    "model and the dev/test text files.")
flags.DEFINE_string("export_dir", "saved_models/numbers", "Where the "
                    "SavedModel versions go.")
flags.DEFINE_string("config", "tiny", "Model preset.")
flags.DEFINE_string("hparams", "", "Config overrides.")
flags.DEFINE_integer("train_steps", 1000, "Optimizer updates.")
flags.DEFINE_integer("vocab_size", 1000, "Shared vocabulary size.")
flags.DEFINE_integer("average_checkpoints", 5, "Checkpoints averaged.")
flags.DEFINE_integer("num_examples", 8, "Test sentences shown at the end.")
flags.DEFINE_integer("seed", 0, "Seed of data, initialization and order.")
flags.DEFINE_integer("numbers_train_size", None, "Training pairs (default: "
                     "the task's 40,000); fewer for a quick try.")

BIN = os.path.dirname(os.path.abspath(__file__))


class StageError(Exception):
  pass


def run(stage, script, *args, echo=True):
  """Runs bin/`script` with this interpreter, passing its output through;
  returns (stdout, stderr) as text."""
  command = [sys.executable, os.path.join(BIN, script), *args]
  print(f"\n== {stage}: {script} {' '.join(shlex.quote(a) for a in args)}",
        flush=True)
  process = subprocess.Popen(command, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True,
                             env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
  # Progress (absl logs on stderr) is shown as it comes; stdout at the end.
  stderr_lines = []
  for line in process.stderr:
    stderr_lines.append(line)
    if echo and _progress(line):
      print("   " + _strip_prefix(line), end="", flush=True)
  stdout = process.stdout.read()
  if process.wait() != 0:
    sys.stderr.write("".join(stderr_lines[-30:]))
    raise StageError(f"{stage} failed ({script} exited with "
                     f"{process.returncode}); its last messages are above")
  if echo and stdout:
    print("".join("   " + line + "\n" for line in stdout.splitlines()), end="")
  return stdout, "".join(stderr_lines)


def _progress(line):
  """The training driver's own log lines, not TensorFlow's."""
  return re.match(r"^[IWE]\d{4} .*(train|trainer|checkpoints)\.py:\d+\]",
                  line) is not None


def _strip_prefix(line):
  return re.sub(r"^[IWE]\d{4} [\d:.]+ +\d+ [\w.]+:\d+\] ", "", line)


def _scores(stdout):
  found = {}
  for name in ("BLEU", "chrF", "exact_match"):
    match = re.search(rf"^{name} = ([\d.]+)", stdout, re.M)
    found[name] = float(match.group(1)) if match else float("nan")
  return found


def main(argv):
  del argv
  times, work = {}, FLAGS.work_dir
  run_dir = os.path.join(work, "run")
  averaged = os.path.join(work, "averaged")
  os.makedirs(run_dir, exist_ok=True)
  size = ([f"--numbers_train_size={FLAGS.numbers_train_size}"]
          if FLAGS.numbers_train_size else [])
  try:
    start = time.time()
    if not os.path.exists(os.path.join(run_dir, "test.de")):
      run("prepare", "prepare_data.py", "--dataset=numbers", *size,
          f"--vocab_size={FLAGS.vocab_size}", f"--seed={FLAGS.seed}",
          f"--output_dir={run_dir}", "--write_text=dev,test")
    times["prepare"] = time.time() - start

    start = time.time()
    train_out, _ = run(
        "train", "train.py", f"--config={FLAGS.config}",
        f"--hparams={FLAGS.hparams}", "--dataset=numbers", *size,
        f"--model_dir={run_dir}", f"--vocab_size={FLAGS.vocab_size}",
        f"--train_steps={FLAGS.train_steps}", f"--seed={FLAGS.seed}",
        "--checkpoint_every_secs=0",
        f"--checkpoint_every_steps={max(1, FLAGS.train_steps // 10)}",
        f"--eval_every_steps={max(1, FLAGS.train_steps // 3)}",
        f"--log_every_steps={max(1, min(100, FLAGS.train_steps // 10))}")
    times["train"] = time.time() - start

    start = time.time()
    averaged_out, _ = run("average", "average_checkpoints.py",
                          f"--model_dir={run_dir}",
                          f"--num_checkpoints={FLAGS.average_checkpoints}",
                          f"--output_dir={averaged}")
    times["average"] = time.time() - start

    start = time.time()
    exported, _ = run("export", "export.py", f"--model_dir={averaged}",
                      f"--export_dir={FLAGS.export_dir}")
    model = exported.strip().rsplit(" ", 1)[-1]
    times["export"] = time.time() - start

    start = time.time()
    scores = {}
    for split in ("dev", "test"):
      out, _ = run(f"evaluate {split}", "evaluate.py", f"--model={model}",
                   f"--source={os.path.join(run_dir, split + '.en')}",
                   f"--reference={os.path.join(run_dir, split + '.de')}",
                   f"--output={os.path.join(work, split + '.translation')}")
      scores[split] = _scores(out)
    times["evaluate"] = time.time() - start

    start = time.time()
    with open(os.path.join(run_dir, "test.en"), encoding="utf-8") as f:
      sources = [next(f).rstrip("\n") for _ in range(FLAGS.num_examples)]
    with open(os.path.join(run_dir, "test.de"), encoding="utf-8") as f:
      references = [next(f).rstrip("\n") for _ in range(FLAGS.num_examples)]
    examples = os.path.join(work, "examples.en")
    with open(examples, "w", encoding="utf-8") as f:
      f.write("".join(s + "\n" for s in sources))
    translated, _ = run("translate", "translate.py", f"--model={model}",
                        f"--input={examples}", echo=False)
    times["translate"] = time.time() - start
  except StageError as e:
    print(f"main_job: error: {e}", file=sys.stderr)
    return 1

  final = re.search(r"trained to step (\d+)(?:: loss [\d.]+ .* -> ([\d.]+))?",
                    train_out)
  print("\n== summary")
  if final:
    step, loss = final.groups()
    print(f"trained    {FLAGS.config} model to step {step}, "
          + (f"last loss {loss}, in {_minutes(times['train'])}" if loss
             else "in an earlier run"))
  print(f"averaged   {averaged_out.splitlines()[0]}")
  print(f"exported   {model} (beam 4, alpha 0.6)")
  for split in ("dev", "test"):
    s = scores[split]
    print(f"{split:<10} exact match {s['exact_match']:.4f}  chrF "
          f"{s['chrF']:.2f}  BLEU {s['BLEU']:.2f}")
  print("           (sacrebleu; each German number is one word, so there are "
        "no 4-grams\n           and BLEU is 0 whatever the output: read exact "
        "match)")
  print("\nexamples through the SavedModel (source | translation | "
        "reference):")
  for source, translation, reference in zip(
      sources, translated.splitlines(), references):
    mark = "ok" if translation == reference else "WRONG"
    print(f"  {source} | {translation} | {reference}  {mark}")
  print("\ntimes: " + ", ".join(f"{k} {_minutes(v)}" for k, v in
                                times.items()))
  return 0


def _minutes(seconds):
  return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


if __name__ == "__main__":
  app.run(main)
