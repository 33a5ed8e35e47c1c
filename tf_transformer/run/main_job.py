"""The main job as one in-process call (`run_job`): build the vocabulary,
train, average the last checkpoints, export a SavedModel for TF Serving of
the average, of the best checkpoint by dev, or (where the run trained on
past its best) of the average of the checkpoints up to the best, whichever
scores highest there by the task's dev metric (`Task.best_metric`), score
dev and test through it, and translate examples through it next to their
references.
bin/main_job.py is its flags and its printout.

Each stage calls the `Runner` and is announced with the bin/ command that
does the same alone, so any stage can be rerun by hand; the command's flags
and the call's arguments are written once (`_given`, `command_line`). Run it
again and the finished training is reused (a killed one resumes from its
last checkpoint); each run exports the next version of `export_dir`.
"""

import dataclasses
import gzip
import json
import os
import shlex
import shutil
import time
from typing import Callable, Optional

from absl import logging

from tf_transformer import config as config_lib
from tf_transformer.data import numbers
from tf_transformer.data.corpora import read_lines
from tf_transformer.data.sources import DataSpec
from tf_transformer.decoding.search import DecodingOptions
from tf_transformer.serving.output import one_line
from tf_transformer.run import choice
from tf_transformer.run import run_config
from tf_transformer.run import run_dir as run_dir_lib
from tf_transformer.run import runner as runner_lib
from tf_transformer.run.tasks import TASKS
from tf_transformer.training import best as best_lib
from tf_transformer.training import budget
from tf_transformer.training import checkpoints
from tf_transformer.training import precision


LANGUAGES = ("en", "de")


class JobError(Exception):
  """A stage cannot run; the message names the flag or file."""


class JobStopped(Exception):
  """Training was stopped by a signal, with a checkpoint: run again."""


@dataclasses.dataclass
class JobResult:
  task: str
  config: str
  training: dict  # Runner.train's result
  averaged: runner_lib.Averaged
  # The checkpoints up to the best dev evaluation, averaged where the run
  # trained on past it (`_average_up_to_best`), else None.
  averaged_up_to_best: Optional[runner_lib.Averaged]
  chosen: str  # which weights were exported, and why (a line)
  export: str  # the SavedModel version
  weights: str  # the exported weights' model directory (--init_from takes it)
  decoding: DecodingOptions  # the export's search
  export_dtype: str  # its weights' and matmuls' type
  texts: dict  # split -> (source file, reference file)
  scores: dict  # split -> evaluation.score of the SavedModel's output
  examples: list  # (source, translation, reference) of the first test lines
  times: dict  # stage -> seconds


def task_files(task, task_name, data_dir, out_dir):
  """Writes the task's split files, decompressed, into `out_dir`; returns
  {split: (source path, target path)}. Raises JobError naming what is
  missing."""
  if not data_dir:
    raise JobError(f"--task={task_name} needs --data_dir (the folder with "
                   f"{', '.join(task.splits.values())} .en/.de files)")
  os.makedirs(out_dir, exist_ok=True)
  paths = {}
  for split, stem in task.splits.items():
    paths[split] = []
    for language in LANGUAGES:
      name = f"{stem}.{language}"
      found = [p for p in (os.path.join(data_dir, name + ".gz"),
                           os.path.join(data_dir, name)) if os.path.isfile(p)]
      if not found:
        raise JobError(f"--data_dir={data_dir} has no {name}.gz or {name}")
      target = os.path.join(out_dir, name)
      if not os.path.exists(target):
        opener = gzip.open if found[0].endswith(".gz") else open
        with opener(found[0], "rb") as src, open(target + ".tmp", "wb") as dst:
          shutil.copyfileobj(src, dst)
        os.replace(target + ".tmp", target)
      paths[split].append(target)
  return paths


def _data(task, task_name, data_dir, work_dir, run_dir, seed,
          numbers_train_size, train_pairs=None):
  """(DataSpec, its bin/ flags, {split: (source, reference) files});
  `train_pairs`, (source, target) file pairs, replace the task's training
  files (a student's distilled targets: several pairs are several
  corpora, drawn alike)."""
  if task.splits:
    files = task_files(task, task_name, data_dir,
                       os.path.join(work_dir, "data"))
    if train_pairs:
      files["train"] = [",".join(files) for files in zip(*train_pairs)]
    spec = DataSpec(dataset="", seed=seed, **{
        f"{split}_{side}": path for split, pair in files.items()
        for side, path in zip(("source", "target"), pair)})
    flags = ["--dataset="] + [f"--{split}_{side}={path}"
                              for split, pair in files.items()
                              for side, path in zip(("source", "target"),
                                                    pair)]
    return spec.check(), flags, {s: files[s] for s in ("dev", "test")}
  size = numbers_train_size or numbers.DEFAULT_SIZES["train"]
  spec = DataSpec(dataset="numbers", numbers_train_size=size, seed=seed)
  flags = ["--dataset=numbers"] + ([f"--numbers_train_size={size}"]
                                   if numbers_train_size else [])
  return spec.check(), flags, {
      split: tuple(os.path.join(run_dir, f"{split}.{language}")
                   for language in LANGUAGES) for split in ("dev", "test")}


def _cadence(task, train_steps, minutes, average_checkpoints):
  """(checkpoint_every_steps, checkpoint_every_secs, eval_every_steps,
  log_every_steps); 0 is never."""
  steps = train_steps or 100_000  # the small_corpus preset's bound
  every = max(1, min(task.checkpoint_every_steps or steps, steps // 10))
  every_secs = 0
  if minutes:
    # A time budget is checkpointed by time, so that the averaged
    # checkpoints are the last quarter of the run on any host: a count of
    # steps was a different share of the run on each (the last 5 of 100
    # steps were the last 55% of a 665-step run and 2 points of val BLEU
    # below its last 3, docs/recipes.md). Steps still count where they bound
    # the run too.
    every_secs = max(1, round(minutes * 60 / (4 * average_checkpoints)))
    every = every if train_steps else 0
  evaluate_every = max(1, min(task.eval_every_steps or steps, steps // 3))
  return every, every_secs, evaluate_every, max(1, min(100, steps // 10))


def _train_config(config_name, hparams, train_steps):
  """The TransformerConfig that bin/train.py builds from these flags."""
  config = config_lib.get_config(config_name, hparams)
  return config.replace(train_steps=train_steps) if train_steps else config


def _sized_for_budget(config_name, hparams, train_steps, run_dir, minutes,
                      mixed_precision, probe=precision.probe_tokens_per_sec,
                      shown=None, tell=lambda line: None, **choose_args):
  """--hparams with the model and dropout that the time budget suits on
  this host (`training/budget.py`), for a new `small_corpus` run given
  minutes and none of those hparams of its own; else `hparams` as given.
  The precision is chosen here (and kept for the run), so that its probe
  gives the rate, and chosen again for the long-run model where the plan
  trains it; `probe` and `choose_args` (`precision.choose`'s) are a
  test's to force. `tell` hears the budget against `shown` (the task's
  README run, `budget.against_shown`) where the run is sized."""
  given = config_lib.parse_overrides(hparams)
  if (config_name != "small_corpus" or not minutes
      or any(name in given for name, _ in budget.LONG_RUN_HPARAMS)
      or os.path.exists(os.path.join(run_dir, run_dir_lib.CONFIG))):
    return hparams
  config = _train_config(config_name, hparams, train_steps)
  chosen, _ = precision.resolve(run_dir, mixed_precision or None, config,
                                probe=probe, **choose_args)
  kept = (precision.kept_tokens_per_sec(run_dir)
          if mixed_precision == precision.AUTO else None)
  rate = kept or probe(config, chosen)
  with open(os.path.join(run_dir, run_config.STATS_FILE)) as f:
    stats = json.load(f)
  plan = budget.plan(rate, minutes, stats, config)
  logging.info("sized for the budget: %s", plan.reason)
  if shown:
    tell(budget.against_shown(plan.epochs, minutes, shown))
  if not plan.hparams:
    return hparams
  sized = ",".join(filter(None, (hparams, plan.hparams)))
  if mixed_precision == precision.AUTO:
    # The preset's precision need not be the long-run model's (bfloat16
    # gained less at d_model 128): its own probe chooses, and is kept.
    os.remove(os.path.join(run_dir, precision.FILENAME))
    config = _train_config(config_name, sized, train_steps)
    _, reason = precision.resolve(run_dir, mixed_precision, config,
                                  probe=probe, **choose_args)
    logging.info("mixed precision for the long-run model: %s", reason)
  return sized


def run_job(task_name="numbers", work_dir=None, export_dir=None,
            data_dir=None, config=None, hparams="", train_steps=None,
            train_minutes=None, vocab_size=None, average_checkpoints=5,
            num_examples=8, seed=0, numbers_train_size=None,
            export_dtype="float32", mixed_precision="auto", stop=None,
            announce: Callable[[str, str], None] = lambda stage, line: None,
            train_pairs=None, vocabulary_from=None, export_shortlist=None,
            init_from=None) -> JobResult:
  """Runs every stage; `announce(stage, command)` hears of each before it
  starts. A student's job (`student_job.py`) trains on `train_pairs`
  ((source, target) files replacing the task's training files), with the
  vocabulary of the run `vocabulary_from` (copied, not built), starts from
  the weights of `init_from` (a model directory; `train.py --init_from`),
  and exports over a vocabulary shortlist of its training data,
  `export_shortlist` (K, N). Raises JobError (a missing flag or file), JobStopped, and what
  the stages raise (DataError, ValueError, CheckpointError)."""
  task = TASKS[task_name]
  work_dir = work_dir or os.path.join("runs", task_name)
  export_dir = export_dir or os.path.join("saved_models", task_name)
  config_name = config or task.config
  vocab_size = vocab_size or task.vocab_size
  train_steps = train_steps or task.train_steps
  minutes = train_minutes or task.train_minutes
  run_dir = os.path.join(work_dir, "run")
  averaged_dir = os.path.join(work_dir, "averaged")
  os.makedirs(run_dir, exist_ok=True)
  runner = runner_lib.Runner(run_dir)
  times = {}

  start = time.time()
  spec, data_flags, texts = _data(task, task_name, data_dir, work_dir,
                                  run_dir, seed, numbers_train_size,
                                  train_pairs)
  if vocabulary_from and not os.path.exists(
      os.path.join(run_dir, "vocabulary.model")):
    shutil.copy(os.path.join(vocabulary_from, "vocabulary.model"), run_dir)
  if not os.path.exists(os.path.join(run_dir, "vocabulary.model")):
    prepare = dict(vocab_size=vocab_size, seed=seed,
                   write_text=() if task.splits else ("dev", "test"))
    announce("prepare", command_line("prepare_data.py", *data_flags,
                                     output_dir=run_dir, **prepare))
    runner.prepare(spec, **prepare)
  times["prepare"] = time.time() - start

  start = time.time()
  every, every_secs, evaluate_every, log_every = _cadence(
      task, train_steps, minutes, average_checkpoints)
  hparams = _sized_for_budget(
      config_name, hparams, train_steps, run_dir, minutes, mixed_precision,
      shown=task.shown if not train_pairs else None,
      tell=lambda line: announce("budget", line))
  train_config = _train_config(config_name, hparams, train_steps)
  # What bin/train.py takes as flags and `Runner.train` as arguments.
  train = _given(
      vocab_size=vocab_size, seed=seed, train_minutes=minutes,
      checkpoint_every_secs=every_secs, checkpoint_every_steps=every or None,
      eval_every_steps=evaluate_every, best_metric=task.best_metric,
      log_every_steps=log_every, mixed_precision=mixed_precision or None,
      init_from=init_from)
  announce("train", command_line(
      "train.py", f"--config={config_name}", f"--hparams={hparams}",
      *data_flags, model_dir=run_dir, train_steps=train_steps, **train))
  training = runner.train(train_config, spec, stop=stop, **train)
  if training["stopped_by"]:
    raise JobStopped(runner_lib.describe_training(training)[0])
  times["train"] = time.time() - start

  start = time.time()
  saved = len(checkpoints.checkpoint_paths(run_dir))
  average = dict(num_checkpoints=max(1, min(saved, average_checkpoints)),
                 output_dir=averaged_dir)
  announce("average", command_line("average_checkpoints.py",
                                   model_dir=run_dir, **average))
  averaged = runner.average(**average)
  up_to_best_dir = os.path.join(work_dir, "averaged_up_to_best")
  up_to_best = _average_up_to_best(runner, up_to_best_dir, averaged,
                                   average_checkpoints, announce)
  times["average"] = time.time() - start

  start = time.time()
  source, chosen = _choose(
      run_dir, averaged_dir, len(averaged.checkpoints), task.best_metric,
      up_to_best and (up_to_best_dir, len(up_to_best.checkpoints)))
  times["choose"] = time.time() - start

  start = time.time()
  if export_shortlist:
    announce("shortlist", command_line("build_shortlist.py",
                                       model_dir=run_dir))
    _, table = runner.build_shortlist()
    if source["model_dir"] != run_dir:  # the exported weights' directory
      shutil.copy(table, source["model_dir"])
  exporting = _given(checkpoint=source["checkpoint"], export_dir=export_dir,
                     dtype=None if export_dtype == "float32"
                     else export_dtype,
                     shortlist=tuple(export_shortlist or ()) or None)
  announce("export", command_line("export.py",
                                  model_dir=source["model_dir"], **exporting))

  def export_warning(text):  # the export's stages are not announced
    if text.startswith("warning:"):
      announce("export", text)
  export = runner_lib.Runner(source["model_dir"]).export(
      on_stage=export_warning, **exporting)
  decoding = DecodingOptions.from_config(
      run_dir_lib.load_config(source["model_dir"]))
  times["export"] = time.time() - start

  start = time.time()
  translator = runner_lib.open_translator(model=export)
  scores = {}
  for split, (source_file, reference) in texts.items():
    output = os.path.join(work_dir, split + ".translation")
    announce(f"evaluate {split}", command_line(
        "evaluate.py", model=export, source=source_file, reference=reference,
        output=output))
    result = runner_lib.evaluate(translator, read_lines(source_file),
                                 read_lines(reference),
                                 names=(source_file, reference))
    with open(output, "w", encoding="utf-8") as f:
      f.write("".join(one_line(h) + "\n" for h in result.hypotheses))
    scores[split] = result.scores
  times["evaluate"] = time.time() - start

  start = time.time()
  sources = read_lines(texts["test"][0])[:num_examples]
  references = read_lines(texts["test"][1])[:num_examples]
  announce("translate", command_line("translate.py", model=export,
                                     input=texts["test"][0]))
  translations = [n[0][0] for n in runner_lib.translate(translator, sources)]
  times["translate"] = time.time() - start
  weights = (os.path.join(run_dir, "best") if source["checkpoint"] == "best"
             else source["model_dir"])
  return JobResult(task_name, config_name, training, averaged, up_to_best,
                   chosen, export, weights,
                   decoding, export_dtype, texts, scores,
                   list(zip(sources, translations, references)), times)


def _average_up_to_best(runner, output_dir, averaged, count, announce):
  """Where the run trained on past its best dev evaluation, the average of
  the `count` checkpoints ending at that step into `output_dir` (section
  6.1's averaging, moved back to where dev was best: a long run on a small
  corpus overfits, docs/recipes.md); None where the last checkpoints end at
  the best, or fewer than two are kept up to it."""
  best = best_lib.read_best(runner.model_dir)
  if not best or best["step"] >= checkpoints.step_of(averaged.checkpoints[-1]):
    return None
  kept = checkpoints.checkpoint_paths(runner.model_dir, best["step"])
  if len(kept) < 2:
    return None
  arguments = dict(num_checkpoints=min(count, len(kept)),
                   output_dir=output_dir, last_step=best["step"])
  announce("average", command_line("average_checkpoints.py",
                                   model_dir=runner.model_dir, **arguments))
  return runner.average(**arguments)


def _choose(run_dir, averaged_dir, averaged_count, metric, up_to_best=None):
  """({"model_dir", "checkpoint"} to export, a line saying why): the
  average of the last checkpoints, the run's best checkpoint by dev
  (`--checkpoint=best`), or `up_to_best` ((its model directory, how many
  it averaged), or None), as `choice.choose` decides by `metric`. All are
  scored now, alike: translated as training translated dev (its search and
  sentences, from best.json), the loss teacher forced."""
  best = best_lib.read_best(run_dir)
  average = f"the average of the last {averaged_count} checkpoints"
  averaged = dict(model_dir=averaged_dir, checkpoint=None)
  if not best:
    return averaged, (
        f"{average} (no dev evaluation kept a best checkpoint)")
  candidates = [(averaged, average),
                (dict(model_dir=run_dir, checkpoint="best"),
                 f"the best checkpoint, step {best['step']}")]
  if up_to_best:
    directory, count = up_to_best
    candidates.append((dict(model_dir=directory, checkpoint=None),
                       f"the average of the {count} checkpoints up to the "
                       f"best, step {best['step']}"))
  evaluation = best.get("evaluation", {})
  how = dict(decoding=evaluation.get("decoding", "greedy"),
             max_sentences=evaluation.get("max_sentences", 0))
  scored = [choice.Candidate(line, source, runner_lib.Runner(
      source["model_dir"]).dev_scores(source["checkpoint"], **how))
            for source, line in candidates]
  chosen, why = choice.choose(scored, metric)
  name = best_lib.METRIC_NAMES[metric]
  key = best_lib.METRICS[metric][0]
  line = lambda c: (f"{c.name} (dev {name} {c.dev[key]:.4g}, loss "
                    f"{c.dev['loss']:.4f})")
  others = " and ".join(line(c) for c in scored if c is not chosen)
  return chosen.source, (f"{line(chosen)}, over {others}; {why}; "
                         f"{how['decoding']} search")


def _given(**arguments):
  """The arguments that are not None: a stage's bin/ flags and its `Runner`
  call's keyword arguments at once."""
  return {name: value for name, value in arguments.items()
          if value is not None}


def command_line(script, *flags, **arguments):
  """The bin/ command line of a stage: `flags` as they are, then
  `--name=value` for each argument that is not None or empty (sequences
  comma-separated), so that the line and the stage's `Runner` call are
  written once, from the same arguments."""
  for name, value in arguments.items():
    if isinstance(value, (tuple, list)):
      value = ",".join(map(str, value))
    if value is not None and value != "":
      flags += (f"--{name}={value:g}" if isinstance(value, float)
                else f"--{name}={value}",)
  return f"bin/{script} " + " ".join(shlex.quote(a) for a in flags)


def summary(result: JobResult):
  """The job's result as lines for people."""
  training = result.training
  lines = []
  if training["losses"]:
    budget = (f" ({training['train_minutes']:.1f} minutes in all)"
              if training["time_up"] else "")
    lines.append(
        f"trained    {result.config} model to step {training['step']}, "
        f"last loss {training['last_logged_loss']:.4f}, in "
        f"{_minutes(result.times['train'])}{budget}")
  else:
    lines.append(f"trained    {result.config} model to step "
                 f"{training['step']} in an earlier run")
  for averaged, which in ((result.averaged, ""),
                          (result.averaged_up_to_best, " up to the best")):
    if averaged:
      lines.append(f"averaged   {len(averaged.checkpoints)} checkpoints"
                   f"{which}: " + ", ".join(os.path.basename(p)
                                            for p in averaged.checkpoints))
  lines.append(f"chose      {result.chosen}")
  d = result.decoding
  lines.append(f"exported   {result.export} ({d.method} "
               f"{d.beam_size}, alpha {d.length_penalty_alpha}"
               + ("" if result.export_dtype == "float32"
                  else f", {result.export_dtype}") + ")")
  for split, (source, _) in result.texts.items():
    s = result.scores[split]
    lines.append(f"{split:<10} exact match {s['exact_match']:.4f}  chrF "
                 f"{s['chrf']:.2f}  BLEU {s['bleu']:.2f}  "
                 f"({os.path.basename(source)})")
  if TASKS[result.task].splits:
    lines.append("           (sacrebleu, cased, 13a tokens, detokenized "
                 "output against the raw references)")
  else:
    lines.append("           (sacrebleu; each German number is one word, so "
                 "there are no 4-grams\n           and BLEU is 0 whatever "
                 "the output: read exact match)")
  lines.append("\nexamples through the SavedModel (source | translation | "
               "reference):")
  for source, translation, reference in result.examples:
    mark = "" if TASKS[result.task].splits else (
        "  ok" if translation == reference else "  WRONG")
    lines.append(f"  {source} | {translation} | {reference}{mark}")
  lines.append("\ntimes: " + ", ".join(f"{k} {_minutes(v)}"
                                       for k, v in result.times.items()))
  return lines


def _minutes(seconds):
  return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
