"""Config: presets, derived d_k/d_v, overrides, clear errors."""

import pytest

from tf_transformer import config as config_lib


def test_base_and_big_are_the_papers_table3():
  base = config_lib.get_config("base").flat()
  assert [base[k] for k in (
      "num_layers", "d_model", "d_ff", "num_heads", "d_k", "d_v",
      "dropout_rate", "label_smoothing", "train_steps")] == [
          6, 512, 2048, 8, 64, 64, 0.1, 0.1, 100000]
  assert base["norm_position"] == "post" and base["share_embeddings"]
  assert base["positional_encoding"] == "sinusoidal"
  big = config_lib.get_config("big").flat()
  assert [big[k] for k in ("d_model", "d_ff", "num_heads", "d_k",
                           "dropout_rate", "train_steps")] == [
                               1024, 4096, 16, 64, 0.3, 300000]


def test_every_table3_row_has_a_preset():
  rows = ["A1", "A2", "A3", "A4", "B1", "B2", "C1", "C2", "C3", "C4", "C5",
          "C6", "C7", "D1", "D2", "D3", "D4", "E"]
  for row in rows:
    assert row in config_lib.PRESETS
  assert config_lib.get_config("A4").model.num_heads == 32
  assert config_lib.get_config("A4").model.d_k == 16
  assert config_lib.get_config("B1").model.d_k == 16
  assert config_lib.get_config("B1").model.d_v == 64
  assert config_lib.get_config("E").model.positional_encoding == "learned"
  parsing = config_lib.get_config("parsing")
  assert (parsing.model.num_layers, parsing.model.d_model, parsing.model.d_k,
          parsing.decoding.beam_size, parsing.decoding.length_penalty_alpha,
          parsing.decoding.max_decode_length_offset) == (
              4, 1024, 128, 21, 0.3, 300)


def test_overrides_are_typed_and_d_k_follows_d_model():
  c = config_lib.get_config(
      "base", "d_model=256, num_layers=2,dropout_rate=0.2,"
      "share_embeddings=false,positional_encoding=learned")
  m = c.model
  assert m.d_model == 256 and m.d_k == 32 and m.d_v == 32
  assert m.num_layers == 2 and m.dropout_rate == 0.2
  assert m.share_embeddings is False and m.positional_encoding == "learned"


def test_three_parts_serialize_together_and_old_flat_files_load():
  c = config_lib.get_config("C4", "warmup_steps=8000,beam_size=6")
  saved = c.to_dict()
  assert sorted(saved) == ["decoding", "model", "training"]
  assert saved["model"]["d_model"] == 256 and "beam_size" not in saved["model"]
  assert saved["training"]["warmup_steps"] == 8000
  assert saved["decoding"]["beam_size"] == 6
  assert config_lib.TransformerConfig.from_dict(saved) == c
  # Run directories and models saved before the split hold one flat dict.
  assert config_lib.TransformerConfig.from_dict(c.flat()) == c
  replaced = c.replace(train_steps=7, beam_size=2, dropout_rate=0.0)
  assert (replaced.training.train_steps, replaced.decoding.beam_size,
          replaced.model.dropout_rate) == (7, 2, 0.0)
  assert replaced.model.d_k == c.model.d_k
  with pytest.raises(ValueError, match="unknown config field"):
    c.replace(d_modle=3)
  with pytest.raises(ValueError, match="unknown training config field"):
    config_lib.TransformerConfig.from_dict(
        {"training": {"d_model": 3}, "model": {}, "decoding": {}})


@pytest.mark.parametrize("overrides, message", [
    ("d_modle=3", "'d_modle' is not a config field"),
    ("d_model", "expected name=value"),
    ("d_model=big", "hparam d_model='big'"),
    ("dropout_rate=1.5", "dropout_rate=1.5: must be in [0, 1)"),
    ("num_heads=7", "num_heads=7: must divide d_model=512"),
    ("norm_position=middle", "norm_position='middle'"),
    ("share_embeddings=perhaps", "expected true or false"),
])
def test_bad_overrides_name_the_problem(overrides, message):
  with pytest.raises(ValueError, match=None) as error:
    config_lib.get_config("base", overrides)
  assert message in str(error.value)


def test_unknown_preset_lists_the_presets():
  with pytest.raises(ValueError) as error:
    config_lib.get_config("huge")
  assert "unknown config preset 'huge'" in str(error.value)
  assert "tiny" in str(error.value)
