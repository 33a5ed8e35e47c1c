"""Mixed precision chosen for the host (training/precision.py): by the CPU's
instructions and a probe of the training step, forced here so that every
host takes each branch; kept on resume; given flags override."""

import json

import keras
import pytest

from tf_transformer.config import get_config
from tf_transformer.run import run_dir
from tf_transformer.training import precision
from training_helpers import UNCOMPILED

SMALL = "num_layers=1,d_model=32,d_ff=64,num_heads=2,batch_tokens=256"


def _cpuinfo(tmp_path, flags):
  path = tmp_path / "cpuinfo"
  path.write_text(f"processor : 0\nflags : fpu sse2 avx2 fma {flags}\n")
  return str(path)


def _probe(ratio, calls=None):
  """A forced probe: float32 at 1,000 tokens/s, bfloat16 at `ratio` times
  that."""
  def probe(config, mixed_precision):
    del config
    if calls is not None:
      calls.append(mixed_precision)
    return 1000.0 * (ratio if mixed_precision == "bfloat16" else 1.0)
  return probe


def _never(config, mixed_precision):
  raise AssertionError(f"probed {mixed_precision} on a CPU without bfloat16")


def test_float32_without_bfloat16_instructions_and_no_probe(tmp_path):
  config = get_config("tiny", SMALL)
  choice = precision.choose(config, _cpuinfo(tmp_path, "avx512f"), _never)
  assert choice.mixed_precision is None
  assert "neither AVX512_BF16 nor AMX" in choice.reason
  unread = precision.choose(config, str(tmp_path / "missing"), _never)
  assert unread.mixed_precision is None
  assert "could not read" in unread.reason


@pytest.mark.parametrize("ratio, expected", [
    (1.5, "bfloat16"), (precision.MARGIN, "bfloat16"), (1.05, None),
    (0.64, None)])
def test_bfloat16_only_where_the_probe_finds_it_faster(tmp_path, ratio,
                                                        expected):
  calls = []
  choice = precision.choose(get_config("tiny", SMALL),
                            _cpuinfo(tmp_path, "avx512f avx512_bf16"),
                            _probe(ratio, calls))
  assert sorted(calls, key=str) == [None, "bfloat16"]
  assert choice.mixed_precision == expected
  assert "AVX512_BF16" in choice.reason and f"{ratio:.2f}x" in choice.reason
  assert ("below the" in choice.reason) == (expected is None)


@pytest.mark.parametrize("gpus, expected, says", [
    ([("NVIDIA H100 80GB HBM3", (9, 0))], "bfloat16", "compute capability 9.0"),
    ([("NVIDIA A100-SXM4-40GB", (8, 0))] * 8, "bfloat16", "8 GPU(s)"),
    ([("Tesla V100-SXM2-16GB", (7, 0))], "float16", "dynamic loss scaling"),
    ([("NVIDIA A100", (8, 0)), ("Tesla T4", (7, 5))], "float16",
     "compute capability 7.5")])
def test_with_gpus_auto_decides_by_their_compute_capability(
    tmp_path, gpus, expected, says):
  """The device query faked: bfloat16 from compute capability 8.0 on (the
  oldest GPU decides), float16 before; the CPU is neither read nor
  probed (a CPU without AVX512_BF16 here)."""
  choice = precision.choose(get_config("tiny", SMALL),
                            _cpuinfo(tmp_path, "avx512f"), _never,
                            gpus=lambda: gpus)
  assert choice.mixed_precision == expected
  assert says in choice.reason and gpus[-1][0] in choice.reason
  assert precision.choose(get_config("tiny", SMALL),
                          _cpuinfo(tmp_path, "avx512f"), _never,
                          gpus=list).mixed_precision is None


def test_the_choice_is_saved_kept_and_overridden(tmp_path):
  config = get_config("tiny", SMALL)
  with_bf16 = _cpuinfo(tmp_path, "amx_bf16 amx_tile")
  run = tmp_path / "run"
  run.mkdir()
  chosen, why = precision.resolve(str(run), precision.AUTO, config,
                                  cpuinfo=with_bf16, probe=_probe(1.4))
  assert chosen == "bfloat16" and "AMX_BF16" in why
  saved = json.loads((run / precision.FILENAME).read_text())
  assert saved["mixed_precision"] == "bfloat16"
  # Resumed on a host where the probe would say otherwise: kept.
  kept, why = precision.resolve(str(run), precision.AUTO, config,
                                cpuinfo=with_bf16, probe=_probe(0.5))
  assert kept == "bfloat16" and "kept" in why
  # A given flag overrides, and says nothing.
  for given, expected in (("float32", None), ("", None), (None, None),
                          ("bfloat16", "bfloat16"), ("float16", "float16")):
    assert precision.resolve(str(run), given, config) == (expected, None)
  with pytest.raises(ValueError, match="3 workers"):
    precision.resolve(str(tmp_path), precision.AUTO, config, workers=3)


def test_the_probe_times_both_precisions_and_restores_float32():
  config = get_config("tiny", SMALL)
  for mixed_precision in (None, "bfloat16"):
    tokens_per_sec = precision.probe_tokens_per_sec(config, mixed_precision,
                                                    length=8, steps=1)
    assert tokens_per_sec > 0
    assert keras.mixed_precision.global_policy().name == "float32"


@pytest.mark.slow
def test_a_run_trains_in_the_chosen_precision_and_resumes_in_it(
    tmp_path, monkeypatch):
  """Runner.train with --mixed_precision=auto: the forced choice is
  logged, trained in (the model's policy) and kept by a resumed run."""
  # pylint: disable=g-import-not-at-top
  from tf_transformer.run.runner import Runner
  from tf_transformer.training import trainer as trainer_lib
  from training_helpers import SPEC
  built = []
  original = trainer_lib.Trainer.__init__

  def record(self, *args, **kwargs):
    original(self, *args, **kwargs)
    built.append(self.model.dtype_policy.name)
  monkeypatch.setattr(trainer_lib.Trainer, "__init__", record)
  chose = []

  def forced(config, **unused):
    chose.append(config)
    return precision.Choice("bfloat16", "bfloat16: forced")
  monkeypatch.setattr(precision, "choose", forced)
  options = dict(max_length=32, eval_every_steps=0, checkpoint_every_secs=0,
                 vocab_size=400, mixed_precision=precision.AUTO, **UNCOMPILED)
  Runner(str(tmp_path)).train(get_config("tiny", SMALL, train_steps=1), SPEC,
                              **options)
  resumed = Runner(str(tmp_path)).train(
      get_config("tiny", SMALL, train_steps=2), SPEC, **options)
  assert resumed["step"] == 2
  assert built == ["mixed_bfloat16", "mixed_bfloat16"]
  assert len(chose) == 1  # chosen once, kept on resume
  # What the process does next (the main job averages, chooses and
  # exports) builds in float32: the global policy is the caller's again,
  # and a run loaded to decode or export is float32 whatever the global
  # policy (a float32 export of this run held 510 casts to bfloat16 when
  # the trainer's policy stayed).
  assert keras.mixed_precision.global_policy().name == "float32"
  keras.mixed_precision.set_global_policy("mixed_bfloat16")
  model, _ = run_dir.load_trained_model(str(tmp_path))
  assert model.dtype_policy.name == "float32"
  assert model.compute_dtype == "float32"
  keras.mixed_precision.set_global_policy("float32")
  given = Runner(str(tmp_path)).train(
      get_config("tiny", SMALL, train_steps=3), SPEC,
      **{**options, "mixed_precision": "float32"})
  assert given["step"] == 3 and built[-1] == "float32"


def test_the_students_export_dtype_follows_this_cpu(tmp_path):
  """--student_dtype=auto: float32 without bfloat16 instructions (no probe),
  bfloat16 only where the probe finds it faster, each with its reason; GPUs
  are set aside (the export is timed on the CPU); a given dtype is kept."""
  from tf_transformer.run import student_job  # pylint: disable=g-import-not-at-top
  config = get_config("tiny", SMALL)
  dtype, reason = student_job.export_dtype(
      student_job.AUTO, config, _cpuinfo(tmp_path, "avx512f"), _never)
  assert dtype == "float32" and "neither AVX512_BF16 nor AMX" in reason
  assert "--student_dtype" in reason
  bf16 = _cpuinfo(tmp_path, "avx512f avx512_bf16")
  assert student_job.export_dtype(student_job.AUTO, config, bf16,
                                  _probe(1.5))[0] == "bfloat16"
  dtype, reason = student_job.export_dtype(student_job.AUTO, config, bf16,
                                           _probe(1.05))
  assert dtype == "float32" and "1.05x" in reason and "below the" in reason
  for given in ("float32", "bfloat16"):
    dtype, reason = student_job.export_dtype(given, config, bf16, _never)
    assert dtype == given and "--student_dtype" in reason


def test_the_probe_times_the_step_where_a_run_trains(monkeypatch):
  """The budget's probe runs on the device `bin/train.py` trains on by
  default (the first GPU, else the CPU: create_strategy("one_device")),
  not always on the CPU."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tf_transformer.training import strategy as strategy_lib  # pylint: disable=g-import-not-at-top
  asked = []
  create = strategy_lib.create_strategy

  def recorded(distribution="one_device", **kwargs):
    asked.append(distribution)
    return create(distribution, **kwargs)
  monkeypatch.setattr(strategy_lib, "create_strategy", recorded)
  config = get_config("tiny", SMALL)
  assert precision.probe_tokens_per_sec(config, None, length=8,
                                        steps=1) > 0
  assert asked == ["one_device"]
  assert precision.probe_tokens_per_sec(
      config, None, length=8, steps=1,
      strategy=tf.distribute.OneDeviceStrategy("/cpu:0")) > 0
  assert asked == ["one_device"]
