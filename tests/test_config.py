"""Config: presets, derived d_k/d_v, overrides, clear errors."""

import pytest

from tf_transformer import config as config_lib


def test_base_and_big_are_the_papers_table3():
  base = config_lib.get_config("base")
  assert (base.num_layers, base.d_model, base.d_ff, base.num_heads, base.d_k,
          base.d_v, base.dropout_rate, base.label_smoothing,
          base.train_steps) == (6, 512, 2048, 8, 64, 64, 0.1, 0.1, 100000)
  assert base.norm_position == "post" and base.share_embeddings
  assert base.positional_encoding == "sinusoidal"
  big = config_lib.get_config("big")
  assert (big.d_model, big.d_ff, big.num_heads, big.d_k, big.dropout_rate,
          big.train_steps) == (1024, 4096, 16, 64, 0.3, 300000)


def test_every_table3_row_has_a_preset():
  rows = ["A1", "A2", "A3", "A4", "B1", "B2", "C1", "C2", "C3", "C4", "C5",
          "C6", "C7", "D1", "D2", "D3", "D4", "E"]
  for row in rows:
    assert row in config_lib.PRESETS
  assert config_lib.get_config("A4").num_heads == 32
  assert config_lib.get_config("A4").d_k == 16
  assert config_lib.get_config("B1").d_k == 16
  assert config_lib.get_config("B1").d_v == 64
  assert config_lib.get_config("E").positional_encoding == "learned"
  parsing = config_lib.get_config("parsing")
  assert (parsing.num_layers, parsing.d_model, parsing.d_k, parsing.beam_size,
          parsing.length_penalty_alpha,
          parsing.max_decode_length_offset) == (4, 1024, 128, 21, 0.3, 300)


def test_overrides_are_typed_and_d_k_follows_d_model():
  c = config_lib.get_config(
      "base", "d_model=256, num_layers=2,dropout_rate=0.2,"
      "share_embeddings=false,positional_encoding=learned")
  assert c.d_model == 256 and c.d_k == 32 and c.d_v == 32
  assert c.num_layers == 2 and c.dropout_rate == 0.2
  assert c.share_embeddings is False and c.positional_encoding == "learned"


def test_round_trip_through_dict():
  c = config_lib.get_config("C4")
  assert config_lib.TransformerConfig.from_dict(c.to_dict()) == c


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
