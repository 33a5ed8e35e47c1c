"""Dropout sized for a time budget (training/budget.py) and the main job's
use of it, with the probe of the training step forced so that every host
takes each branch."""

import json

import pytest

from tf_transformer.config import get_config
from tf_transformer.run import main_job
from tf_transformer.training import budget
from tf_transformer.training import precision

# Multi30k's training pairs as the job's statistics count them.
STATS = {"train": {"pairs": 29000, "source_tokens": 444296,
                   "target_tokens": 430038}}


def test_planned_epochs_are_the_budgets_tokens_over_the_corpus():
  config = get_config("small_corpus")
  # 10,000 tokens/s for 60 minutes: 36M tokens over 874,334 an epoch.
  assert budget.planned_epochs(10_000, 60, STATS, 100_000, 4096) == (
      pytest.approx(36e6 / 874_334))
  # 100 steps of 4,096 tokens a side end the run first.
  assert budget.planned_epochs(10_000, 60, STATS, 100, 4096) == (
      pytest.approx(100 * 8192 / 874_334))
  assert config.model.dropout_rate == 0.1


@pytest.mark.parametrize("minutes, tokens_per_sec, expected", [
    (20, 15_439, None),  # a fast host's 20 minutes: 21 epochs
    (60, 15_439, 0.3),  # its 60 minutes: 64 epochs
    (60, 5_500, None),  # an AVX2 host's 60 minutes: 23 epochs
])
def test_long_plans_get_the_long_run_dropout(minutes, tokens_per_sec,
                                             expected):
  plan = budget.plan(tokens_per_sec, minutes, STATS,
                     get_config("small_corpus"))
  assert plan.dropout_rate == expected
  assert (plan.epochs > budget.LONG_RUN_EPOCHS) == (expected is not None)
  assert f"at most {plan.epochs:.0f} epochs" in plan.reason
  assert plan.reason.startswith(f"dropout {expected or 0.1}")


def test_a_small_corpus_keeps_the_presets_dropout_however_long():
  """5,000 pairs for 20 minutes are over 100 planned epochs, but there
  dropout 0.3 lost: fewer than MIN_PAIRS keep the preset's."""
  stats = {"train": {"pairs": 5000, "source_tokens": 76_000,
                     "target_tokens": 74_000}}
  plan = budget.plan(15_000, 20, stats, get_config("small_corpus"))
  assert plan.epochs > 100 and plan.dropout_rate is None
  assert "of 5,000 training pairs, fewer than the 20,000" in plan.reason


def _cpuinfo(tmp_path):
  path = tmp_path / "cpuinfo"
  path.write_text("processor : 0\nflags : fpu avx2 avx512f avx512_bf16\n")
  return str(path)


def _run_dir(tmp_path):
  run = tmp_path / "run"
  run.mkdir()
  (run / "data_stats.json").write_text(json.dumps(STATS))
  return run


def _probe(tokens_per_sec, calls):
  def probe(config, mixed_precision):
    calls.append((config.model.dropout_rate, mixed_precision))
    return tokens_per_sec * (1.3 if mixed_precision == "bfloat16" else 1.0)
  return probe


def test_the_job_sizes_a_new_small_corpus_runs_dropout_by_its_budget(
    tmp_path):
  """60 minutes at a fast probe's rate: dropout 0.3 added to --hparams,
  with the rate of the precision chosen (and kept for the run); 20
  minutes: --hparams unchanged."""
  calls = []
  run = _run_dir(tmp_path)
  hparams = main_job._sized_for_budget(
      "small_corpus", "label_smoothing=0.1", None, str(run), 60,
      precision.AUTO, _probe(12_000, calls), cpuinfo=_cpuinfo(tmp_path))
  assert hparams == "label_smoothing=0.1,dropout_rate=0.3"
  assert calls == [(0.1, None), (0.1, "bfloat16")]  # the precision's probe
  kept = json.loads((run / precision.FILENAME).read_text())
  assert kept["mixed_precision"] == "bfloat16"
  assert kept["tokens_per_sec"] == pytest.approx(15_600)
  # 20 minutes: 21 epochs at that rate; the kept choice is not probed again.
  assert main_job._sized_for_budget(
      "small_corpus", "", None, str(run), 20, precision.AUTO,
      _probe(12_000, calls)) == ""
  assert len(calls) == 2


def test_the_job_keeps_what_a_run_or_its_flags_already_say(tmp_path):
  """No sizing for another preset, without minutes, where --hparams name a
  dropout, for a run that already has a config (resumed, continued to a
  longer budget: it keeps the dropout it started with), or a step budget
  that ends it first; a given precision is probed as given."""
  calls = []
  run = _run_dir(tmp_path)
  probe = _probe(20_000, calls)
  for args in (("tiny", "", None, str(run), 60),
               ("small_corpus", "", None, str(run), None),
               ("small_corpus", "dropout_rate=0.2", None, str(run), 60)):
    assert main_job._sized_for_budget(*args, precision.AUTO, probe) == (
        args[1])
  assert calls == []
  assert main_job._sized_for_budget(
      "small_corpus", "", 500, str(run), 60, "float32", probe) == ""
  assert calls == [(0.1, None)]
  (run / "config.json").write_text("{}")
  assert main_job._sized_for_budget(
      "small_corpus", "", None, str(run), 60, precision.AUTO, probe) == ""
  assert len(calls) == 1
