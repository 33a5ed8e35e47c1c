"""The main job (tf_transformer/run/main_job.py, bin/main_job.py's one
call) runs every stage in process and returns what each stage produced.
(Short runs: the full jobs' figures are in docs/recipes.md.)"""

import gzip
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from conftest import REPO, run_script
from tf_transformer import evaluation
from tf_transformer.run import main_job
from tf_transformer.run import runner as runner_lib
from tf_transformer.serving import export as export_lib
from tf_transformer.training import checkpoints

# Slow (README.md's quick tier leaves it out): whole jobs, end to end.
pytestmark = pytest.mark.slow

STAGES = ["prepare", "train", "average", "export", "evaluate dev",
          "evaluate test", "translate"]


def test_main_job_end_to_end_then_again_by_its_command(tmp_path):
  work, exports = tmp_path / "work", tmp_path / "saved_models" / "numbers"
  announced, vocabulary_times = [], []

  def announce(stage, line):
    announced.append((stage, line))
    if stage == "train":  # prepare's vocabulary is the one training uses
      vocabulary_times.append(os.stat(work / "run" / "vocabulary.model")
                              .st_mtime_ns)
  flags = dict(work_dir=str(work), export_dir=str(exports),
               numbers_train_size=2000, train_steps=30, vocab_size=400,
               average_checkpoints=2, num_examples=3,
               hparams="max_decode_length_offset=4")  # short outputs
  first = main_job.run_job("numbers", announce=announce, **flags)
  best = json.loads((work / "run" / "best" / "best.json").read_text())
  assert best["step"] in (10, 20, 30) and best["metric"] == "exact_match"
  # A run that trained on past its best also averages the checkpoints up
  # to it (the 2 ending at the best step, saved before its evaluation).
  went_past = best["step"] < 30
  assert [stage for stage, _ in announced] == (
      STAGES[:3] + ["average"] * went_past + STAGES[3:])
  if went_past:
    assert announced[3][1] == (
        f"bin/average_checkpoints.py --model_dir={work}/run "
        f"--num_checkpoints=2 --output_dir={work}/averaged_up_to_best "
        f"--last_step={best['step']}")
    assert [os.path.basename(p) for p in first.averaged_up_to_best.checkpoints
           ] == [f"ckpt-{best['step'] - 1}", f"ckpt-{best['step']}"]
  else:
    assert first.averaged_up_to_best is None
  assert announced[1][1].startswith(
      f"bin/train.py --config=tiny --hparams=max_decode_length_offset=4 "
      f"--dataset=numbers --numbers_train_size=2000 --model_dir={work}/run")
  losses = first.training["losses"]
  assert first.training["step"] == 30 and len(losses) == 30
  assert np.mean(losses[-5:]) < np.mean(losses[:5])
  assert [os.path.basename(p) for p in first.averaged.checkpoints] == [
      "ckpt-27", "ckpt-30"]
  assert first.export == str(exports / "1")
  assert (exports / "1" / "saved_model.pb").exists()
  for split in ("dev", "test"):
    assert 0.0 <= first.scores[split]["exact_match"] <= 1.0
    assert np.isfinite(first.scores[split]["chrf"])
  test_source = (work / "run" / "test.en").read_text().splitlines()
  assert [source for source, _, _ in first.examples] == test_source[:3]
  assert len((work / "test.translation").read_text().splitlines()) == 500
  summary = "\n".join(main_job.summary(first))
  assert "trained    tiny model to step 30, last loss " in summary
  assert "averaged   2 checkpoints: ckpt-27, ckpt-30" in summary
  # The export is the average or the run's best checkpoint by the task's
  # dev metric, whichever ranks higher there, and the summary says which,
  # by what and why.
  assert "--best_metric=exact_match" in announced[1][1]
  # The precision is chosen for this host (training/precision.py), kept in
  # the run directory, and the announced command asks for the same.
  assert "--mixed_precision=auto" in announced[1][1]
  chosen = json.loads((work / "run" / "precision.json").read_text())
  assert chosen["mixed_precision"] in (None, "bfloat16"), chosen
  export_command = dict(announced)["export"]
  if first.chosen.startswith("the best checkpoint"):
    assert f"--model_dir={work}/run --checkpoint=best" in export_command
    assert f"step {best['step']} (dev exact match" in first.chosen
  elif first.chosen.startswith("the average of the last"):
    assert first.chosen.startswith("the average of the last 2 checkpoints "
                                   "(dev exact match ")
    assert f"--model_dir={work}/averaged " in export_command
  else:
    assert went_past and first.chosen.startswith(
        "the average of the 2 checkpoints up to the best, step "
        f"{best['step']} (dev exact match ")
    assert f"--model_dir={work}/averaged_up_to_best " in export_command
  assert first.chosen.count(" (dev exact match ") == 2 + went_past
  # Why: the average leads, or another leads beyond chance, or within it
  # (then the average stays: run/choice.py).
  why = first.chosen.split("; ")[1]
  assert first.chosen.endswith("; greedy search")
  if why.startswith("section 6.1's average: "):
    assert first.chosen.startswith("the average of the last 2 checkpoints")
    assert " dev exact match is within chance (McNemar's exact test, " \
        "p = " in why
  elif why.endswith(", tied: a tie keeps section 6.1's average"):
    assert first.chosen.startswith("the average of the last 2 checkpoints")
  else:
    assert why == "the highest dev exact match" or (
        why.startswith("the highest dev exact match, +") and
        " over the average, beyond chance (McNemar's exact test, p = "
        in why), first.chosen
  assert f"chose      {first.chosen}" in summary
  # The dev scores the choice compares carry the translations they score,
  # for its paired test.
  dev = runner_lib.Runner(str(work / "run")).dev_scores("best")
  assert len(dev["hypotheses"]) == len(dev["references"]) > 0
  assert dev["exact_match"] == evaluation.score(
      dev["hypotheses"], dev["references"])["exact_match"]

  # Again, as a user reruns it: the finished training and the vocabulary
  # are reused, and the next version is exported, in bfloat16 this time.
  again = run_script("main_job.py", *[f"--{k}={v}" for k, v in flags.items()],
                     "--export_dtype=bfloat16", timeout=900)
  assert again.returncode == 0, again.stderr[-3000:]
  # Its log is for reading: TensorFlow's note, thousands of characters
  # long, that the export renames the search's captured tensors is dropped.
  assert "will be renamed" not in again.stderr
  assert max(map(len, again.stderr.splitlines())) < 1000
  out = again.stdout
  for stage in STAGES[1:]:
    assert f"\n== {stage}: bin/" in out, stage
  assert "\n== prepare" not in out
  assert os.stat(work / "run" / "vocabulary.model").st_mtime_ns == (
      vocabulary_times[0])
  assert "trained    tiny model to step 30 in an earlier run" in out
  assert f"exported   {exports}/2 (beam 4, alpha 0.6, bfloat16)" in out
  assert f"--export_dir={exports} --dtype=bfloat16\n" in out
  assert ("\n== export: warning: " in out) == (
      export_lib.bfloat16_warning() is not None)
  examples = out.split("(source | translation | reference):\n")[1]
  rows = [line for line in examples.splitlines() if line.startswith("  ")]
  assert len(rows) == 3 and all(line.count(" | ") == 2 for line in rows)


MULTI30K = os.environ.get("MULTI30K_DIR", os.path.join(
    os.path.dirname(REPO), "shared", "data", "multi30k"))


def _cut_multi30k(directory, sizes=(("train", 300), ("val", 40),
                                     ("test_2016_flickr", 40))):
  """The first lines of each Multi30k file, gzipped like the originals."""
  directory.mkdir()
  for stem, lines in sizes:
    for language in ("en", "de"):
      with gzip.open(os.path.join(MULTI30K, f"{stem}.{language}.gz"),
                     "rt", encoding="utf-8") as f:
        head = [next(f) for _ in range(lines)]
      with gzip.open(directory / f"{stem}.{language}.gz", "wt",
                     encoding="utf-8") as f:
        f.write("".join(head))
  return directory


@pytest.mark.skipif(not os.path.isdir(MULTI30K), reason=(
    f"the Multi30k captions are not at {MULTI30K} (set MULTI30K_DIR to the "
    "folder with train/val/test_2016_flickr .en.gz/.de.gz)"))
def test_main_job_multi30k_on_a_few_hundred_captions(tmp_path):
  data_dir = _cut_multi30k(tmp_path / "multi30k")
  announced = []
  result = main_job.run_job(
      "multi30k", work_dir=str(tmp_path / "work"),
      export_dir=str(tmp_path / "saved_models" / "multi30k"),
      data_dir=str(data_dir), train_steps=10, vocab_size=600,
      average_checkpoints=2, num_examples=2,
      hparams="num_layers=1,d_model=64,d_ff=128,max_decode_length_offset=4",
      announce=lambda stage, line: announced.append(line))
  assert "--train_source=" in announced[1] and (
      "--train_minutes=20" in announced[1])
  assert result.config == "small_corpus" and result.training["step"] == 10
  assert [os.path.basename(p) for p in result.averaged.checkpoints] == [
      "ckpt-9", "ckpt-10"]
  assert [os.path.basename(result.texts[split][0])
          for split in ("dev", "test")] == ["val.en", "test_2016_flickr.en"]
  assert all(np.isfinite(result.scores[split]["bleu"])
             for split in ("dev", "test"))
  assert result.examples[0][0] == (
      "A man in an orange hat starring at something.")
  assert len(result.examples) == 2
  assert len((tmp_path / "work" / "test.translation").read_text()
             .splitlines()) == 40
  assert (tmp_path / "work" / "data" / "train.de").read_text(
      encoding="utf-8").count("\n") == 300


def test_main_job_multi30k_names_what_is_missing(tmp_path):
  result = run_script("main_job.py", "--task=multi30k",
                      f"--work_dir={tmp_path / 'work'}")
  assert result.returncode == 1
  assert "main_job: error: --task=multi30k needs --data_dir" in result.stderr
  (tmp_path / "empty").mkdir()
  result = run_script("main_job.py", "--task=multi30k",
                      f"--data_dir={tmp_path / 'empty'}",
                      f"--work_dir={tmp_path / 'work'}")
  assert result.returncode == 1
  assert (f"main_job: error: --data_dir={tmp_path / 'empty'} has no "
          "train.en.gz or train.en" in result.stderr)
  helped = run_script("main_job.py", "--help")
  assert helped.returncode == 0 and "--data_dir" in helped.stdout
  result = run_script("main_job.py", "--student",
                      f"--work_dir={tmp_path / 'work'}")
  assert result.returncode == 1
  assert ("main_job: error: --student: --task=numbers has no training files "
          "to distill; use --task=multi30k") in result.stderr


def test_a_time_budget_is_checkpointed_by_time():
  """The averaged checkpoints are the last quarter of a timed run on any
  host: by seconds, not by a count of steps that is a different share of
  the run on a slow host and a fast one."""
  task = main_job.TASKS["multi30k"]
  # (steps, secs, eval, log) for 20 and 60 minutes, 5 averaged.
  assert main_job._cadence(task, None, 20, 5) == (0, 60, 500, 100)  # pylint: disable=protected-access
  assert main_job._cadence(task, None, 60, 5)[:2] == (0, 180)  # pylint: disable=protected-access
  assert main_job._cadence(task, None, 20, 2)[:2] == (0, 150)  # pylint: disable=protected-access
  # Steps that bound the run too keep their spacing beside the seconds.
  assert main_job._cadence(task, 10, 20, 2)[:2] == (1, 150)  # pylint: disable=protected-access
  # A run bounded by steps alone (the numbers task) goes by steps.
  assert main_job._cadence(main_job.TASKS["numbers"], 1000, None, 5) == (  # pylint: disable=protected-access
      100, 0, 333, 100)


# Dev translations of 100 sentences: every one right, or the first N wrong.
DEV_REFERENCES = [f"satz {i}" for i in range(100)]


def _dev(exact_match, loss):
  """Dev scores whose translations get `exact_match` of DEV_REFERENCES."""
  wrong = round((1 - exact_match) * 100)
  return {"bleu": 0.0, "exact_match": exact_match, "loss": loss,
          "references": DEV_REFERENCES,
          "hypotheses": ["falsch"] * wrong + DEV_REFERENCES[wrong:]}


def _choice(tmp_path, monkeypatch, metric, averaged_dev, best_dev,
            up_to_best_dev=None):
  """main_job._choose between an average, a best checkpoint (step 666) and,
  where `up_to_best_dev` is given, the average of 4 checkpoints up to it,
  whose dev scores are given; returns (what to export, line)."""
  run, averaged = str(tmp_path / "run"), str(tmp_path / "averaged")
  up_to_best = str(tmp_path / "averaged_up_to_best")
  os.makedirs(os.path.join(run, "best"), exist_ok=True)
  with open(os.path.join(run, "best", "best.json"), "w") as f:
    json.dump({"checkpoint": "ckpt-666", "step": 666, "metric": metric,
               "evaluation": {"decoding": "greedy", "max_sentences": 0}}, f)
  dev = {(averaged, None): averaged_dev, (run, "best"): best_dev,
         (up_to_best, None): up_to_best_dev}
  monkeypatch.setattr(
      runner_lib.Runner, "dev_scores",
      lambda self, checkpoint=None, decoding="greedy", max_sentences=0:
      dev[(self.model_dir, checkpoint)])
  return main_job._choose(run, averaged, 5, metric, up_to_best_dev and (  # pylint: disable=protected-access
      up_to_best, 4))


def test_the_job_chooses_by_the_tasks_metric(tmp_path, monkeypatch):
  """What the README's numbers job met on one host: by BLEU it exported the
  best checkpoint (0.21 against 0.00), whose exact match was 0.818 against
  the average's 0.996. By exact match, the average."""
  average = dict(_dev(0.99, 1.9), bleu=0.0)
  best = dict(_dev(0.82, 2.1), bleu=0.21)
  assert main_job.TASKS["numbers"].best_metric == "exact_match"
  assert main_job.TASKS["multi30k"].best_metric == "bleu"
  source, line = _choice(tmp_path, monkeypatch, "exact_match", average,
                         best)
  assert source == dict(model_dir=str(tmp_path / "averaged"), checkpoint=None)
  assert line == (
      "the average of the last 5 checkpoints (dev exact match 0.99, loss "
      "1.9000), over the best checkpoint, step 666 (dev exact match 0.82, "
      "loss 2.1000); the highest dev exact match; greedy search")
  # By BLEU, the task's metric for translation, the line names BLEU and
  # its test (both systems' sacrebleu BLEU is 0 on these one-word
  # sentences, so the lead in the scores given is no evidence).
  source, line = _choice(tmp_path, monkeypatch, "bleu", average, best)
  assert source == dict(model_dir=str(tmp_path / "averaged"), checkpoint=None)
  assert line.endswith(
      "; section 6.1's average: a lead of +0.21 dev BLEU is within chance "
      "(paired bootstrap, p = 1); "
      "greedy search")


def test_a_lead_within_chance_keeps_the_average(tmp_path, monkeypatch):
  """The README's 60-minute job with --seed=1 exported the best checkpoint
  for 0.1 greedy dev BLEU over the average, which then scored higher on
  val and test (docs/recipes.md). Two sentences more right (McNemar
  p = 0.5) keep the average; ten (p = 0.002) do not."""
  average = _dev(0.90, 2.0)
  source, line = _choice(tmp_path, monkeypatch, "exact_match", average,
                         _dev(0.92, 1.9))
  assert source["model_dir"] == str(tmp_path / "averaged")
  assert line.endswith(
      "; section 6.1's average: a lead of +0.02 dev exact match is within "
      "chance (McNemar's exact test, p = 0.5); greedy search")
  source, line = _choice(tmp_path, monkeypatch, "exact_match", average,
                         _dev(1.0, 1.9))
  assert source == dict(model_dir=str(tmp_path / "run"), checkpoint="best")
  assert line.startswith("the best checkpoint, step 666 (dev exact match 1,")
  assert line.endswith("; the highest dev exact match, +0.1 over the "
                       "average, beyond chance (McNemar's exact test, "
                       "p = 0.002); greedy search")


def test_the_job_can_choose_the_average_up_to_the_best(tmp_path,
                                                      monkeypatch):
  """A run that trained on past its best (a long run on a small corpus)
  has a third candidate, scored alike; the one with the highest dev metric
  is tested against the average, equal values keeping the average, then
  the order best, average up to the best."""
  average, best = _dev(0.80, 2.0), _dev(0.85, 1.9)
  source, line = _choice(tmp_path, monkeypatch, "exact_match", average, best,
                         _dev(0.95, 1.8))
  assert source == dict(model_dir=str(tmp_path / "averaged_up_to_best"),
                        checkpoint=None)
  assert line.startswith(
      "the average of the 4 checkpoints up to the best, step 666 (dev exact "
      "match 0.95, loss 1.8000), over the average of the last 5 checkpoints "
      "(dev exact match 0.8, loss 2.0000) and the best checkpoint, step 666 "
      "(dev exact match 0.85, loss 1.9000); the highest dev exact match, "
      "+0.15 over the average, beyond chance (McNemar's exact test, p = ")
  source, _ = _choice(tmp_path, monkeypatch, "exact_match", average,
                      _dev(0.95, 1.9), _dev(0.95, 1.8))
  assert source == dict(model_dir=str(tmp_path / "run"), checkpoint="best")
  source, _ = _choice(tmp_path, monkeypatch, "exact_match", best, average,
                      best)
  assert source["model_dir"] == str(tmp_path / "averaged")


def test_the_average_up_to_the_best_only_where_the_run_went_past_it(
    tmp_path):
  """Averaged (with the job's count, fewer where fewer are kept) only when
  the newest averaged checkpoint is later than the best and at least two
  checkpoints are kept up to it."""
  run = tmp_path / "run"
  (run / "best").mkdir(parents=True)
  kept = [str(run / f"ckpt-{step}") for step in (500, 600, 700, 800, 900)]
  # The run's checkpoint state as its CheckpointManager leaves it.
  tf.compat.v1.train.update_checkpoint_state(
      str(run), kept[-1], all_model_checkpoint_paths=kept)
  assert checkpoints.checkpoint_paths(str(run)) == kept
  calls, announced = [], []

  class FakeRunner:
    model_dir = str(run)

    def average(self, **arguments):
      calls.append(arguments)
      return runner_lib.Averaged("path", kept[:2])

  def up_to_best(best_step, count=5):
    (run / "best" / "best.json").write_text(json.dumps({"step": best_step}))
    calls.clear()
    return main_job._average_up_to_best(  # pylint: disable=protected-access
        FakeRunner(), "out", runner_lib.Averaged("path", kept[-3:]), count,
        lambda stage, line: announced.append(line))

  assert up_to_best(600) is not None
  assert calls == [dict(num_checkpoints=2, output_dir="out", last_step=600)]
  assert announced[-1] == (f"bin/average_checkpoints.py --model_dir={run} "
                           "--num_checkpoints=2 --output_dir=out "
                           "--last_step=600")
  assert up_to_best(800, count=3) is not None
  assert calls == [dict(num_checkpoints=3, output_dir="out", last_step=800)]
  for step in (900, 500):  # the newest averaged is the best; one kept
    assert up_to_best(step) is None and not calls


def test_a_tie_keeps_the_average_and_loss_decides_only_by_loss(
    tmp_path, monkeypatch):
  """Equal dev exact match keeps section 6.1's average, whatever the
  losses; `--best_metric=loss` takes the lowest dev loss."""
  source, line = _choice(tmp_path, monkeypatch, "exact_match",
                         _dev(0.98, 1.95), _dev(0.98, 1.90))
  assert source["model_dir"] == str(tmp_path / "averaged")
  assert line.endswith("; the highest dev exact match, tied: a tie keeps "
                       "section 6.1's average; greedy search")
  source, line = _choice(tmp_path, monkeypatch, "loss", _dev(0.98, 1.95),
                         _dev(0.90, 1.90))
  assert source["checkpoint"] == "best"
  assert line.startswith("the best checkpoint, step 666 (dev loss 1.9, ")
  assert line.endswith("; the lowest dev loss; greedy search")


@pytest.mark.skipif(not os.path.isdir(MULTI30K), reason=(
    f"the Multi30k captions are not at {MULTI30K} (set MULTI30K_DIR to the "
    "folder with train/val/test_2016_flickr .en.gz/.de.gz)"))
def test_student_job_distills_the_teacher_into_a_shallow_decoder(tmp_path):
  """--student: the teacher's job, its translations of the training
  sources (the announced translate.py --resume), a 2-1 student started from
  the 2-2 teacher's weights, trained on them with its vocabulary and
  exported over a shortlist in the dtype given (announced; `auto` is
  test_precision's), and both timed side by side."""
  from tf_transformer.run import run_dir as run_dir_lib  # pylint: disable=g-import-not-at-top
  from tf_transformer.run import student_job  # pylint: disable=g-import-not-at-top
  data_dir = _cut_multi30k(tmp_path / "multi30k", (
      ("train", 120), ("val", 16), ("test_2016_flickr", 16)))
  work, exports = tmp_path / "work", tmp_path / "saved_models" / "multi30k"
  announced = []
  result = student_job.run_student_job(
      "multi30k", work_dir=str(work), export_dir=str(exports),
      data_dir=str(data_dir), train_steps=8, vocab_size=500,
      average_checkpoints=2, num_examples=1,
      hparams="num_layers=2,d_model=32,d_ff=64,max_decode_length_offset=4",
      student_hparams="num_decoder_layers=1,max_decode_length_offset=4",
      student_steps=8, student_shortlist=(5, 10), student_dtype="bfloat16",
      announce=lambda stage, line: announced.append((stage, line)))
  stages = dict(announced)  # the student's stages come last
  distill = stages["distill"]
  assert distill.startswith("bin/translate.py --resume ") and (
      f"--output={result.distilled}" in distill)
  distilled = open(result.distilled, encoding="utf-8").read().splitlines()
  assert result.distilled_now == len(distilled) == 120
  student_run = str(work / "student" / "run")
  spec = run_dir_lib.load_spec(student_run)
  assert spec.train_target == result.distilled
  assert open(os.path.join(student_run, "vocabulary.model"), "rb").read() == (
      open(work / "run" / "vocabulary.model", "rb").read())
  train = stages["train"]
  assert train.endswith(f" --init_from={result.teacher.weights}") and (
      "--hparams=num_layers=2,d_model=32,d_ff=64," in train)
  assert result.depths == {"teacher": (2, 2), "student": (2, 1)}
  assert result.parameters["student"] < result.parameters["teacher"]
  assert result.student.export.startswith(f"{exports}_student")
  assert result.student.export_dtype == "bfloat16"
  assert stages["student dtype"] == "bfloat16, as --student_dtype gave"
  assert os.path.exists(os.path.join(student_run, "shortlist.npz"))
  assert all(s.one_sentence_ms > 0 and s.sentences_per_cpu_second > 0
             for s in result.speed.values())
  table = student_job.summary(result)[-3:]
  assert table[0].startswith("model") and "1 sentence, CPU ms" in table[0]
  assert table[1].startswith("teacher (float32)") and " 2-2 " in table[1]
  assert table[2].startswith("student (bfloat16, shortlist 5,10)") and (
      " 2-1 " in table[2])
