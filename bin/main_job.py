#!/usr/bin/env python3
r"""The main job, end to end with the repository's own commands: build the
vocabulary, train, average the last checkpoints, export a SavedModel for TF
Serving, score dev and test through it, and translate examples through it
next to their references.

  bin/main_job.py                        # the embedded numbers task, ~4 min
  bin/main_job.py --task=multi30k --data_dir=../shared/data/multi30k
                                         # real captions, ~25 min on 2 cores

--task=numbers (the default) trains the `tiny` preset for 1,000 steps on the
generated English-German number task. --task=multi30k reads the Multi30k
English-German captions from --data_dir (train, val and test_2016_flickr,
`.en`/`.de`, gzipped or not; never copied anywhere but --work_dir) and
trains the `small_corpus` preset for --train_minutes (20), then reports
sacrebleu BLEU and chrF on test_2016_flickr.

Each stage runs a bin/ script (its command is printed first, so any stage
can be rerun by hand) and the job ends with a summary. Run it again and the
finished training is reused (a killed one resumes from its last
checkpoint); each run exports the next version of --export_dir.
"""

import dataclasses
import glob
import gzip
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from typing import Optional

from absl import flags

from tf_transformer import command


@dataclasses.dataclass(frozen=True)
class Task:
  config: str
  vocab_size: int
  train_steps: Optional[int]  # None: the preset's, bounded by the minutes
  train_minutes: Optional[float]
  checkpoint_every_steps: Optional[int]  # None: train_steps // 10
  eval_every_steps: Optional[int]  # None: train_steps // 3
  splits: dict  # our split name -> the task's file stem


TASKS = {
    "numbers": Task("tiny", 1000, 1000, None, None, None, {}),
    # 20 minutes are ~1,500 steps of 4,096 tokens on 2 cores: a checkpoint
    # every 100 steps puts the 5 averaged ones in the last 7 minutes.
    "multi30k": Task("small_corpus", 8000, None, 20, 100, 500,
                     {"train": "train", "dev": "val",
                      "test": "test_2016_flickr"}),
}
LANGUAGES = ("en", "de")

FLAGS = flags.FLAGS
flags.DEFINE_enum("task", "numbers", sorted(TASKS), "numbers: the embedded "
                  "generated task; multi30k: the Multi30k captions in "
                  "--data_dir.")
flags.DEFINE_string("data_dir", None, "--task=multi30k: the folder with "
                    "train, val and test_2016_flickr .en/.de files "
                    "(gzipped or not).")
flags.DEFINE_string("work_dir", None, "Run directory, averaged model and "
                    "the dev/test text files (default: runs/TASK).")
flags.DEFINE_string("export_dir", None, "Where the SavedModel versions go "
                    "(default: saved_models/TASK).")
flags.DEFINE_string("config", None, "Model preset (default: the task's, "
                    "tiny or small_corpus).")
flags.DEFINE_string("hparams", "", "Config overrides.")
flags.DEFINE_integer("train_steps", None, "Optimizer updates (default: the "
                     "task's; numbers 1000).")
flags.DEFINE_float("train_minutes", None, "Training time budget (default: "
                   "the task's; multi30k 20).")
flags.DEFINE_integer("vocab_size", None, "Shared vocabulary size (default: "
                     "the task's; numbers 1000, multi30k 8000).")
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
  command_line = [sys.executable, os.path.join(BIN, script), *args]
  print(f"\n== {stage}: {script} {' '.join(shlex.quote(a) for a in args)}",
        flush=True)
  process = subprocess.Popen(command_line, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
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
  """The commands' own log lines, not TensorFlow's."""
  return re.match(r"^[IWE]\d{4} .*(train|trainer|checkpoints|prepare|"
                  r"progress)\.py:\d+\]", line) is not None


def _strip_prefix(line):
  return re.sub(r"^[IWE]\d{4} [\d:.]+ +\d+ [\w.]+:\d+\] ", "", line)


def _scores(stdout):
  found = {}
  for name in ("BLEU", "chrF", "exact_match"):
    match = re.search(rf"^{name} = ([\d.]+)", stdout, re.M)
    found[name] = float(match.group(1)) if match else float("nan")
  return found


def task_files(task, data_dir, out_dir):
  """Writes the task's split files, decompressed, into `out_dir`; returns
  {split: (source path, target path)}. Raises StageError naming a missing
  file."""
  if not data_dir:
    raise StageError(f"--task={FLAGS.task} needs --data_dir (the folder "
                     f"with {', '.join(task.splits.values())} .en/.de files)")
  os.makedirs(out_dir, exist_ok=True)
  paths = {}
  for split, stem in task.splits.items():
    paths[split] = []
    for language in LANGUAGES:
      name = f"{stem}.{language}"
      found = [p for p in (os.path.join(data_dir, name + ".gz"),
                           os.path.join(data_dir, name)) if os.path.isfile(p)]
      if not found:
        raise StageError(f"--data_dir={data_dir} has no {name}.gz or {name}")
      target = os.path.join(out_dir, name)
      if not os.path.exists(target):
        opener = gzip.open if found[0].endswith(".gz") else open
        with opener(found[0], "rb") as src, open(target + ".tmp", "wb") as dst:
          shutil.copyfileobj(src, dst)
        os.replace(target + ".tmp", target)
      paths[split].append(target)
  return paths


def main(argv):
  del argv
  task = TASKS[FLAGS.task]
  work = FLAGS.work_dir or os.path.join("runs", FLAGS.task)
  export_dir = FLAGS.export_dir or os.path.join("saved_models", FLAGS.task)
  config = FLAGS.config or task.config
  vocab_size = FLAGS.vocab_size or task.vocab_size
  train_steps = FLAGS.train_steps or task.train_steps
  minutes = FLAGS.train_minutes or task.train_minutes
  times, run_dir = {}, os.path.join(work, "run")
  averaged = os.path.join(work, "averaged")
  os.makedirs(run_dir, exist_ok=True)
  try:
    start = time.time()
    if task.splits:
      files = task_files(task, FLAGS.data_dir, os.path.join(work, "data"))
      data = ["--dataset="] + [
          f"--{split}_{side}={path}" for split, pair in files.items()
          for side, path in zip(("source", "target"), pair)]
      texts = {split: files[split] for split in ("dev", "test")}
    else:
      data = ["--dataset=numbers"] + (
          [f"--numbers_train_size={FLAGS.numbers_train_size}"]
          if FLAGS.numbers_train_size else [])
      texts = {split: [os.path.join(run_dir, f"{split}.{language}")
                       for language in LANGUAGES] for split in ("dev", "test")}
    if not os.path.exists(os.path.join(run_dir, "vocabulary.model")):
      run("prepare", "prepare_data.py", *data, f"--vocab_size={vocab_size}",
          f"--seed={FLAGS.seed}", f"--output_dir={run_dir}",
          *([] if task.splits else ["--write_text=dev,test"]))
    times["prepare"] = time.time() - start

    start = time.time()
    steps = train_steps or 100_000  # the small_corpus preset's bound
    every = max(1, min(task.checkpoint_every_steps or steps, steps // 10))
    if minutes:
      # About 70 steps a minute on 2 cores: 5 steps per budget minute (at
      # most the task's 100) keeps the averaged checkpoints in the last
      # quarter of a short run.
      every = max(1, min(every, round(5 * minutes)))
    evaluate_every = max(1, min(task.eval_every_steps or steps, steps // 3))
    train_out, _ = run(
        "train", "train.py", f"--config={config}",
        f"--hparams={FLAGS.hparams}", *data, f"--model_dir={run_dir}",
        f"--vocab_size={vocab_size}", f"--seed={FLAGS.seed}",
        *([f"--train_steps={train_steps}"] if train_steps else []),
        *([f"--train_minutes={minutes:g}"] if minutes else []),
        "--checkpoint_every_secs=0", f"--checkpoint_every_steps={every}",
        f"--eval_every_steps={evaluate_every}",
        f"--log_every_steps={max(1, min(100, steps // 10))}")
    times["train"] = time.time() - start

    start = time.time()
    saved = len(glob.glob(os.path.join(run_dir, "ckpt-*.index")))
    if saved < FLAGS.average_checkpoints:
      print(f"\n(the run saved {saved} checkpoints: averaging those, not "
            f"--average_checkpoints={FLAGS.average_checkpoints})")
    averaged_out, _ = run("average", "average_checkpoints.py",
                          f"--model_dir={run_dir}",
                          f"--num_checkpoints="
                          f"{max(1, min(saved, FLAGS.average_checkpoints))}",
                          f"--output_dir={averaged}")
    times["average"] = time.time() - start

    start = time.time()
    exported, _ = run("export", "export.py", f"--model_dir={averaged}",
                      f"--export_dir={export_dir}")
    model = exported.strip().rsplit(" ", 1)[-1]
    times["export"] = time.time() - start

    start = time.time()
    scores = {}
    for split, (source, reference) in texts.items():
      out, _ = run(f"evaluate {split}", "evaluate.py", f"--model={model}",
                   f"--source={source}", f"--reference={reference}",
                   f"--output={os.path.join(work, split + '.translation')}")
      scores[split] = _scores(out)
    times["evaluate"] = time.time() - start

    start = time.time()
    source, reference = texts["test"]
    with open(source, encoding="utf-8") as f:
      sources = [next(f).rstrip("\n") for _ in range(FLAGS.num_examples)]
    with open(reference, encoding="utf-8") as f:
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
  budget = re.search(r"([\d.]+) minutes trained in all", train_out)
  print("\n== summary")
  if final:
    step, loss = final.groups()
    print(f"trained    {config} model to step {step}, "
          + (f"last loss {loss}, in {_minutes(times['train'])}" if loss
             else "in an earlier run")
          + (f" ({budget.group(1)} minutes in all)" if budget else ""))
  print(f"averaged   {averaged_out.splitlines()[0]}")
  print(f"exported   {model} (beam 4, alpha 0.6)")
  for split, (source, _) in texts.items():
    s = scores[split]
    print(f"{split:<10} exact match {s['exact_match']:.4f}  chrF "
          f"{s['chrF']:.2f}  BLEU {s['BLEU']:.2f}  "
          f"({os.path.basename(source)})")
  if task.splits:
    print("           (sacrebleu, cased, 13a tokens, detokenized output "
          "against the raw references)")
  else:
    print("           (sacrebleu; each German number is one word, so there "
          "are no 4-grams\n           and BLEU is 0 whatever the output: read "
          "exact match)")
  print("\nexamples through the SavedModel (source | translation | "
        "reference):")
  for source, translation, reference in zip(
      sources, translated.splitlines(), references):
    mark = "" if task.splits else (
        "  ok" if translation == reference else "  WRONG")
    print(f"  {source} | {translation} | {reference}{mark}")
  print("\ntimes: " + ", ".join(f"{k} {_minutes(v)}" for k, v in
                                times.items()))
  return 0


def _minutes(seconds):
  return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


if __name__ == "__main__":
  command.run(main)
