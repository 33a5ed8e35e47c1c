"""Parameter counts and FLOPs: closed form = built model; Table 3 matched."""

import re

import pytest

from tf_transformer import config as config_lib
from tf_transformer import cost
from tf_transformer import model as model_lib
from tf_transformer.run import run_dir
from conftest import run_script
from training_helpers import write_run_dir


@pytest.mark.parametrize("name", sorted(config_lib.PRESETS))
def test_closed_form_equals_built_model(name):
  # A small vocabulary keeps the big rows quick to build; the vocabulary term
  # is checked at full size below.
  config = config_lib.get_config(name, vocab_size=101, max_length=64)
  assert model_lib.build_model(config).count_params() == cost.parameter_count(
      config.model)


@pytest.mark.parametrize("overrides", [
    "norm_position=pre", "share_embeddings=false",
    "positional_encoding=learned,norm_position=pre",
    "num_encoder_layers=3,num_decoder_layers=1"])
def test_closed_form_equals_built_model_for_options(overrides):
  config = config_lib.get_config("tiny", overrides)
  assert model_lib.build_model(config).count_params() == cost.parameter_count(
      config.model)


def test_base_and_big_with_shared_37000_vocabulary():
  base = config_lib.get_config("base", vocab_size=37000)
  big = config_lib.get_config("big", vocab_size=37000)
  assert model_lib.build_model(base).count_params() == 63_082_496
  assert round(cost.parameter_count(base.model) / 1e6, 2) == 63.08
  assert round(cost.parameter_count(big.model) / 1e6, 2) == 214.25


@pytest.mark.parametrize("row, paper",
                         sorted(config_lib.TABLE3_PARAMS_MILLIONS.items()))
def test_table3_params_column(row, paper):
  at_37k = cost.parameter_count(
      config_lib.get_config(row, vocab_size=37000).model)
  at_41k = cost.parameter_count(
      config_lib.get_config(row, vocab_size=41000).model)
  assert abs(at_37k / 1e6 - paper) / paper < 0.07
  assert abs(at_41k / 1e6 - paper) / paper < 0.03


def test_flops_grow_with_model_and_length():
  base = config_lib.get_config("base")
  big = config_lib.get_config("big")
  assert cost.flops_per_token(big.model) > 3 * cost.flops_per_token(base.model)
  assert cost.flops_per_token(base.model, 256) > cost.flops_per_token(
      base.model, 16)


def test_forward_flops_counted_by_hand():
  c = config_lib.ModelConfig(vocab_size=10, num_layers=1, d_model=4, d_ff=8,
                             num_heads=2)
  # Source 3 tokens, target 2; 2 FLOPs per multiply-add.
  encoder = 2 * (3*4*4 + 3*4*8 + 3*3*2*4 + 3*4*4) + 2 * 3 * 2 * 4 * 8
  decoder_self = 2 * (2*4*4 + 2*4*8 + 2*2*2*4 + 2*4*4)
  decoder_cross = 2 * (2*4*4 + 3*4*8 + 2*3*2*4 + 2*4*4)
  decoder_ffn = 2 * 2 * 2 * 4 * 8
  softmax = 2 * 2 * 4 * 10
  assert cost.forward_flops(c, 3, 2) == (encoder + decoder_self + decoder_cross
                                         + decoder_ffn + softmax) == 2064


@pytest.mark.slow
def test_model_summary_script_prints_params_and_flops():
  result = run_script("model_summary.py", "--config=base",
                      "--vocab_size=37000")
  assert result.returncode == 0, result.stderr
  lines = result.stdout.strip().splitlines()
  assert re.fullmatch(r"params=\d+", lines[-2]) and lines[-2] == "params=63082496"
  flops = int(re.fullmatch(r"flops_per_token=(\d+)", lines[-1]).group(1))
  assert flops == cost.flops_per_token(config_lib.get_config("base").model)
  assert "encoder" in result.stdout and "decoder" in result.stdout


def test_model_summary_script_reads_a_trained_run(tmp_path):
  model_dir = write_run_dir(tmp_path / "run")
  result = run_script("model_summary.py", f"--model_dir={model_dir}")
  assert result.returncode == 0, result.stderr
  config = run_dir.load_config(str(model_dir))
  model = model_lib.build_model(config)
  assert f"params={model.count_params()}" in result.stdout.splitlines()
  assert f"the model of {model_dir}" in result.stdout
  missing = run_script("model_summary.py", f"--model_dir={tmp_path}/none")
  assert missing.returncode != 0
  assert "not a model directory" in missing.stderr


def test_model_summary_script_rejects_bad_hparams():
  result = run_script("model_summary.py", "--config=tiny",
                      "--hparams=d_modle=4")
  assert result.returncode != 0
  assert "'d_modle' is not a config field" in result.stderr
  assert "Traceback" not in result.stderr
