"""Config: presets, derived d_k/d_v, overrides, clear errors."""

import json

import pytest

from tf_transformer import config as config_lib
from tf_transformer.config import get_config


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


def test_stack_depths_default_to_num_layers_and_follow_it():
  """num_encoder_layers and num_decoder_layers: num_layers unless given;
  a config saved before they existed reads with both at num_layers; one
  that equals num_layers follows `replace(num_layers=...)`, one given
  stays; below 1 is refused by name."""
  tiny = config_lib.get_config("tiny")
  assert (tiny.model.num_encoder_layers, tiny.model.num_decoder_layers) == (
      2, 2)
  student = config_lib.get_config("tiny", "num_decoder_layers=1,num_layers=4")
  assert (student.model.num_encoder_layers,
          student.model.num_decoder_layers) == (4, 1)
  saved = tiny.to_dict()
  del saved["model"]["num_encoder_layers"], saved["model"]["num_decoder_layers"]
  assert config_lib.TransformerConfig.from_dict(saved) == tiny
  deeper = student.replace(num_layers=6)
  assert (deeper.model.num_encoder_layers,
          deeper.model.num_decoder_layers) == (6, 1)
  both = tiny.replace(num_layers=3, num_encoder_layers=5).model
  assert (both.num_encoder_layers, both.num_decoder_layers) == (5, 3)
  for field in ("num_encoder_layers", "num_decoder_layers"):
    assert field in config_lib.ARCHITECTURE_FIELDS
    with pytest.raises(ValueError, match=f"{field}=0: must be a positive"):
      config_lib.get_config("tiny", f"{field}=0")


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


def test_a_run_saved_with_a_removed_field_loads_unless_it_used_it():
  """Release 0.1 saved `learning_rate_schedule` ("eq3" unless the budget
  schedule was asked for) and `subword_alpha` (0.0 unless subword
  regularization was): such a run loads as before; one that used either is
  refused in one line, since resuming it without would change its recipe."""
  saved = config_lib.get_config("tiny").to_dict()
  saved["training"]["learning_rate_schedule"] = "eq3"
  assert config_lib.TransformerConfig.from_dict(saved) == (
      config_lib.get_config("tiny"))
  saved["training"].update(subword_alpha=0.0, subword_samples=8)
  assert config_lib.TransformerConfig.from_dict(saved) == (
      config_lib.get_config("tiny"))
  for name, value in (("learning_rate_schedule", "budget"),
                      ("subword_alpha", 0.1)):
    changed = json.loads(json.dumps(saved))
    changed["training"][name] = value
    with pytest.raises(ValueError, match=f"{name}={value!r}: removed in "
                       "release 1.0"):
      config_lib.TransformerConfig.from_dict(changed)
    with pytest.raises(ValueError, match=f"hparam '{name}': removed in "
                       "release 1.0"):
      config_lib.get_config("tiny", f"{name}={value}")


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


def test_auto_config_follows_the_training_pairs():
  """--config=auto (bin/train.py's default): small_corpus below a million
  pairs, base above; --hparams and flags win over the choice."""
  few, reason = config_lib.AutoConfig().resolve(5_000)
  assert few == get_config("small_corpus")
  assert reason == ("--config=auto: small_corpus for 5,000 training pairs "
                    "(fewer than 1,000,000)")
  assert config_lib.AutoConfig().resolve(4_500_000) == (
      get_config("base"), "--config=auto: base for 4,500,000 training pairs")
  asked = config_lib.AutoConfig(
      "dropout_rate=0.2", (("train_steps", 7),)).resolve(5_000)[0]
  assert (asked.model.dropout_rate, asked.training.train_steps) == (0.2, 7)


@pytest.mark.slow
def test_auto_config_is_chosen_once_and_kept_on_resume(tmp_path):
  from tf_transformer.run import run_dir  # pylint: disable=g-import-not-at-top
  from tf_transformer.run.runner import Runner  # pylint: disable=g-import-not-at-top
  from training_helpers import SPEC, UNCOMPILED  # pylint: disable=g-import-not-at-top
  small = "num_layers=1,d_model=32,d_ff=64,num_heads=2,batch_tokens=512"
  options = dict(max_length=32, eval_every_steps=0, checkpoint_every_secs=0,
                 vocab_size=400, **UNCOMPILED)
  auto = config_lib.AutoConfig(small, (("train_steps", 1),))
  Runner(str(tmp_path)).train(auto, SPEC, **options)
  saved = run_dir.load_config(str(tmp_path))
  assert saved.training.warmup_steps == 400  # small_corpus, for 300 pairs
  assert saved.model.num_layers == 1  # --hparams over the preset
  again = Runner(str(tmp_path)).train(
      config_lib.AutoConfig(small, (("train_steps", 2),)), SPEC, **options)
  assert again["step"] == 2
  # A run begun with a named preset (as bin/train.py's old default, base,
  # on a small corpus) resumes under auto as that preset, not as the one
  # auto would choose for its pairs.
  named = tmp_path / "named"
  Runner(str(named)).train(get_config("base", small, train_steps=1), SPEC,
                           **options)
  resumed = Runner(str(named)).train(
      config_lib.AutoConfig(small, (("train_steps", 2),)), SPEC, **options)
  assert resumed["step"] == 2
  assert run_dir.load_config(str(named)).training.warmup_steps == 4000


def test_a_resumed_run_may_change_its_decoding_settings(tmp_path):
  """Beam, length penalty and length limit touch neither the weights nor
  the training: a resume may change them without --allow_recipe_change,
  and the run's config keeps them for its evaluations and exports; a
  recipe field still needs the flag."""
  from tf_transformer.run import run_dir  # pylint: disable=g-import-not-at-top
  from tf_transformer.run.runner import Runner  # pylint: disable=g-import-not-at-top
  from training_helpers import SPEC  # pylint: disable=g-import-not-at-top
  small = "num_layers=1,d_model=32,d_ff=64,num_heads=2,batch_tokens=512"
  options = dict(max_length=32, eval_every_steps=0, checkpoint_every_secs=0,
                 vocab_size=400)
  Runner(str(tmp_path)).train(get_config("tiny", small, train_steps=1), SPEC,
                              **options)
  resumed = Runner(str(tmp_path)).train(
      get_config("tiny", small + ",length_penalty_alpha=1.0,beam_size=2",
                 train_steps=2), SPEC, **options)
  assert resumed["step"] == 2
  decoding = run_dir.load_config(str(tmp_path)).decoding
  assert (decoding.length_penalty_alpha, decoding.beam_size) == (1.0, 2)
  with pytest.raises(ValueError, match="dropout_rate"):
    Runner(str(tmp_path)).train(
        get_config("tiny", small + ",length_penalty_alpha=1.0,beam_size=2,"
                   "dropout_rate=0.3", train_steps=3), SPEC, **options)
