"""The model and dropout sized for a time budget (training/budget.py) and
the main job's use of it, with the probe of the training step forced so
that every host takes each branch."""

import json

import pytest

from tf_transformer.config import get_config
from tf_transformer.run import main_job
from tf_transformer.run import tasks
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


@pytest.mark.parametrize("minutes, tokens_per_sec, long_run", [
    (20, 15_439, False),  # a fast host's 20 minutes: 21 epochs
    (60, 15_439, True),  # its 60 minutes: 64 epochs
    (60, 5_500, False),  # an AVX2 host's 60 minutes: 23 epochs
])
def test_long_plans_get_the_long_run_model(minutes, tokens_per_sec,
                                           long_run):
  plan = budget.plan(tokens_per_sec, minutes, STATS,
                     get_config("small_corpus"))
  assert (plan.epochs > budget.LONG_RUN_EPOCHS) == long_run
  assert f"at most {plan.epochs:.0f} epochs" in plan.reason
  if not long_run:
    assert plan.hparams == ""
    assert plan.reason.startswith("the preset's model with dropout 0.1")
    return
  assert plan.reason.startswith("the long-run model (num_layers=4,")
  model = get_config("small_corpus", plan.hparams)
  assert (model.model.num_layers, model.model.d_model, model.model.d_ff,
          model.model.num_heads, model.model.dropout_rate) == (
              4, 128, 256, 4, 0.2)
  assert (model.training.warmup_steps,
          model.training.learning_rate_scale) == (2000, 1.0)


def test_a_small_corpus_keeps_the_preset_however_long():
  """5,000 pairs for 20 minutes are over 100 planned epochs, but there
  more dropout lost: fewer than MIN_PAIRS keep the preset."""
  stats = {"train": {"pairs": 5000, "source_tokens": 76_000,
                     "target_tokens": 74_000}}
  plan = budget.plan(15_000, 20, stats, get_config("small_corpus"))
  assert plan.epochs > 100 and plan.hparams == ""
  assert "of 5,000 training pairs, fewer than the 20,000" in plan.reason


def _cpuinfo(tmp_path):
  path = tmp_path / "cpuinfo"
  path.write_text("processor : 0\nflags : fpu avx2 avx512f avx512_bf16\n")
  return str(path)


def _run_dir(tmp_path):
  run = tmp_path / "run"
  run.mkdir(parents=True)
  (run / "data_stats.json").write_text(json.dumps(STATS))
  return run


def _probe(tokens_per_sec, calls, bfloat16_gain=None):
  """A forced probe: bfloat16 1.3x faster at d_model 256; at other widths
  `bfloat16_gain` (default the same)."""
  def probe(config, mixed_precision):
    calls.append((config.model.d_model, mixed_precision))
    gain = 1.3 if config.model.d_model == 256 else (bfloat16_gain or 1.3)
    return tokens_per_sec * (gain if mixed_precision == "bfloat16" else 1.0)
  return probe


def test_the_job_sizes_a_new_small_corpus_run_by_its_budget(tmp_path):
  """60 minutes at a fast probe's rate: the long-run model added to
  --hparams, planned at the rate of the preset's chosen precision, then
  the precision chosen again for the long-run model (float32 where its
  bfloat16 gains too little) and kept for the run; 20 minutes: --hparams
  unchanged."""
  calls = []
  run = _run_dir(tmp_path)
  hparams = main_job._sized_for_budget(
      "small_corpus", "label_smoothing=0.1", None, str(run), 60,
      precision.AUTO, _probe(12_000, calls, bfloat16_gain=1.04),
      cpuinfo=_cpuinfo(tmp_path))
  assert hparams == "label_smoothing=0.1," + budget.long_run_hparams()
  # The preset's probe in both precisions, then the long-run model's.
  assert calls == [(256, None), (256, "bfloat16"),
                   (128, None), (128, "bfloat16")]
  kept = json.loads((run / precision.FILENAME).read_text())
  assert kept["mixed_precision"] is None  # float32: 1.04x is below 1.1x
  assert kept["tokens_per_sec"] == pytest.approx(12_000)
  # A second start keeps that choice: nothing probed again.
  assert precision.resolve(str(run), precision.AUTO,
                           get_config("small_corpus", hparams))[0] is None
  assert len(calls) == 4
  # 20 minutes: 21 epochs at the preset's bfloat16 rate; --hparams as given.
  run20 = _run_dir(tmp_path / "20")
  assert main_job._sized_for_budget(
      "small_corpus", "", None, str(run20), 20, precision.AUTO,
      _probe(12_000, calls), cpuinfo=_cpuinfo(tmp_path)) == ""
  assert calls[4:] == [(256, None), (256, "bfloat16")]
  assert json.loads((run20 / precision.FILENAME).read_text())[
      "mixed_precision"] == "bfloat16"


def test_the_job_keeps_what_a_run_or_its_flags_already_say(tmp_path):
  """No sizing for another preset, without minutes, where --hparams name a
  size or dropout of the long-run model's, for a run that already has a
  config (resumed, continued to a longer budget: it keeps the model it
  started with), or a step budget that ends it first; a given precision is probed as given."""
  calls = []
  run = _run_dir(tmp_path)
  probe = _probe(20_000, calls)
  for args in (("tiny", "", None, str(run), 60),
               ("small_corpus", "", None, str(run), None),
               ("small_corpus", "dropout_rate=0.2", None, str(run), 60),
               ("small_corpus", "d_model=512", None, str(run), 60)):
    assert main_job._sized_for_budget(*args, precision.AUTO, probe) == (
        args[1])
  assert calls == []
  assert main_job._sized_for_budget(
      "small_corpus", "", 500, str(run), 60, "float32", probe) == ""
  assert calls == [(256, None)]
  (run / "config.json").write_text("{}")
  assert main_job._sized_for_budget(
      "small_corpus", "", None, str(run), 60, precision.AUTO, probe) == ""
  assert len(calls) == 1


def test_a_new_run_says_what_its_budget_buys_against_the_readmes(tmp_path):
  """At its start, a sized run says the epochs its minutes buy here (what
  runs make of the probe's rate) against the README run's, and the flags
  that train as far: its steps, with minutes enough at this host's rate."""
  shown = tasks.Shown(1500, 10.0, 20, "a test host")
  told = []
  main_job._sized_for_budget(
      "small_corpus", "", None, str(_run_dir(tmp_path)), 20, "float32",
      _probe(3_000, []), shown=shown, tell=told.append)
  epochs = budget.planned_epochs(3_000, 20, STATS, 100_000, 4096)
  here = budget.RUN_SHARE * epochs
  assert len(told) == 1 and told[0].startswith(
      f"20 minutes buy about {here:.1f} epochs on this host")
  assert "README.md's model trained 10.0 epochs (1,500 steps) in 20 " in (
      told[0]) and "on a test host" in told[0]
  minutes = int(told[0].rsplit("--train_minutes=", 1)[1])
  # Those minutes at this host's rate reach the README run's epochs, by a
  # quarter's margin, not by much more.
  assert 1.2 * 10.0 <= minutes / 20 * here <= 1.3 * 10.0 + here / 20
  assert "--train_steps=1500 " in told[0]
  told.clear()
  main_job._sized_for_budget(
      "small_corpus", "", None, str(_run_dir(tmp_path / "b")), 20,
      "float32", _probe(3_000, []), tell=told.append)
  assert not told  # no README run to compare with
