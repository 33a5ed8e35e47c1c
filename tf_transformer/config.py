"""Hyperparameters of the Transformer and the presets of the paper.

Field names follow the paper: `num_layers` is N, `d_model`, `d_ff`, `num_heads`
is h, `d_k`, `d_v`, `dropout_rate` is P_drop, `label_smoothing` is epsilon_ls
(Table 3). `num_encoder_layers` and `num_decoder_layers` give the two stacks
depths of their own (a distilled student's deep encoder and shallow
decoder); each is N unless given. Presets: `base` and `big` (Table 3, section 6.1), one per varied row
of Table 3 (A1-A4, B1-B2, C1-C7, D1-D4, E), `parsing` (section 6.3),
`small_corpus` (tens of thousands of pairs on a CPU) and `tiny` (tests).

A preset plus an override string such as "d_model=256,num_layers=2" gives a
config; `d_k` and `d_v` default to d_model / h unless given (section 3.2.2).
A config has three parts: `model`, `training` and `decoding`.
"""

import dataclasses
import json
from typing import Optional

# "sinusoidal": section 3.5's sines and cosines interleaved;
# "sinusoidal_halves": the same sines then the same cosines, [sin | cos], as
# Transformers' and CTranslate2's Marian models lay them out;
# "sinusoidal_opennmt": [sin | cos] with tensor2tensor's frequencies
# (spaced by 1/(d_model/2 - 1)) and positions counted from 1, as OpenNMT-tf's
# SinusoidalPositionEncoder computes them.
POSITIONAL_ENCODINGS = ("sinusoidal", "sinusoidal_halves",
                        "sinusoidal_opennmt", "learned")
# eq. 2's max(0, .) is "relu"; "gelu_tanh" is GELU's tanh approximation.
ACTIVATIONS = ("relu", "swish", "gelu", "gelu_tanh")
DECODER_STARTS = ("bos", "zero")
# What a checkpoint's weights are made for; every other field is the training
# recipe, runtime or decoding, which a resumed run may change.
ARCHITECTURE_FIELDS = ("vocab_size", "num_layers", "num_encoder_layers",
                       "num_decoder_layers", "d_model", "d_ff",
                       "num_heads", "d_k", "d_v", "positional_encoding",
                       "max_length", "share_embeddings", "norm_position",
                       "layer_norm_epsilon", "activation", "decoder_start",
                       "output_bias", "source_eos")
NORM_POSITIONS = ("post", "pre")


def _fail(config, field, why):
  raise ValueError(f"config field {field}={getattr(config, field)!r}: {why}")


def _check_positive(config, fields):
  for field in fields:
    if getattr(config, field) < 1:
      _fail(config, field, "must be a positive integer")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """The model: its architecture (sections 3.1-3.5) and its dropout (5.4)."""

  vocab_size: int = 37000
  num_layers: int = 6
  # Each stack's depth where the two differ; None: num_layers.
  num_encoder_layers: Optional[int] = None
  num_decoder_layers: Optional[int] = None
  d_model: int = 512
  d_ff: int = 2048
  num_heads: int = 8
  d_k: Optional[int] = None
  d_v: Optional[int] = None
  positional_encoding: str = "sinusoidal"
  max_length: int = 512  # rows of a learned position table; decode cache bound
  share_embeddings: bool = True
  norm_position: str = "post"  # the paper's LayerNorm(x + Dropout(Sublayer(x)))
  layer_norm_epsilon: float = 1e-6
  # The feed-forward's activation (eq. 2: "relu"; "swish" (SiLU), exact
  # "gelu" and "gelu_tanh" for models trained so, such as OPUS-MT's and
  # OpenNMT-tf's).
  activation: str = "relu"
  # What the decoder's first position embeds: "bos", a learned BOS token
  # (special_ids.BOS_ID); "zero", a zero vector (Marian), where BOS_ID is
  # an ordinary piece the search may output.
  decoder_start: str = "bos"
  output_bias: bool = False  # a bias on the logits, x E^T + b
  # Whether every source ends with EOS, as this project trains; OpenNMT-tf
  # models read their source without one unless trained so.
  source_eos: bool = True
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.0

  def __post_init__(self):
    _check_positive(self, ("vocab_size", "num_layers", "d_model", "d_ff",
                           "num_heads", "max_length"))
    for field in ("dropout_rate", "attention_dropout_rate"):
      if not 0.0 <= getattr(self, field) < 1.0:
        _fail(self, field, "must be in [0, 1)")
    if self.positional_encoding not in POSITIONAL_ENCODINGS:
      _fail(self, "positional_encoding",
            f"must be one of {POSITIONAL_ENCODINGS}")
    for field, allowed in (("norm_position", NORM_POSITIONS),
                           ("activation", ACTIVATIONS),
                           ("decoder_start", DECODER_STARTS)):
      if getattr(self, field) not in allowed:
        _fail(self, field, f"must be one of {allowed}")
    for field in ("num_encoder_layers", "num_decoder_layers"):
      if getattr(self, field) is None:
        object.__setattr__(self, field, self.num_layers)
      elif getattr(self, field) < 1:
        _fail(self, field, "must be a positive integer")
    for field in ("d_k", "d_v"):
      if getattr(self, field) is None:
        if self.d_model % self.num_heads:
          _fail(self, "num_heads", f"must divide d_model={self.d_model} "
                f"unless {field} is given")
        object.__setattr__(self, field, self.d_model // self.num_heads)
      elif getattr(self, field) < 1:
        _fail(self, field, "must be a positive integer")


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
  """The training recipe: label smoothing (5.4), Adam and the warm-up
  schedule (5.3, eq. 3), steps and batch size (5.1-5.2)."""

  label_smoothing: float = 0.1
  warmup_steps: int = 4000
  adam_beta_1: float = 0.9
  adam_beta_2: float = 0.98
  adam_epsilon: float = 1e-9
  learning_rate_scale: float = 1.0
  train_steps: int = 100000
  batch_tokens: int = 25000

  def __post_init__(self):
    _check_positive(self, ("warmup_steps", "train_steps", "batch_tokens"))
    if not 0.0 <= self.label_smoothing < 1.0:
      _fail(self, "label_smoothing", "must be in [0, 1)")


@dataclasses.dataclass(frozen=True)
class DecodingConfig:
  """The decoding defaults (section 6.1: beam 4, alpha 0.6, input + 50)."""

  beam_size: int = 4
  length_penalty_alpha: float = 0.6
  max_decode_length_offset: int = 50

  def __post_init__(self):
    _check_positive(self, ("beam_size", "max_decode_length_offset"))
    if self.length_penalty_alpha < 0:
      _fail(self, "length_penalty_alpha", "must be >= 0")


PARTS = {"model": ModelConfig, "training": TrainingConfig,
         "decoding": DecodingConfig}
# Each field name -> its part; names are unique across the parts.
FIELD_PART = {f.name: part for part, cls in PARTS.items()
              for f in dataclasses.fields(cls)}


# Fields a release removed: (the one value a saved run may hold, None for
# any: the field means nothing now (`subword_samples` once `subword_alpha` is
# 0; `xla_attention`, which chose how the attention ran, never what it
# computed), and the release that removed it). Such a run loads without it.
REMOVED = {"learning_rate_schedule": ("eq3", "1.0"),
           "subword_alpha": (0.0, "1.0"), "subword_samples": (None, "1.0"),
           "xla_attention": (None, "1.1")}


def _by_part(values: dict) -> dict:
  """{part: {field: value}} of flat `values`; unknown names raise."""
  for name, (kept, release) in REMOVED.items():
    if kept is not None and values.get(name, kept) != kept:
      raise ValueError(f"{name}={values[name]!r}: removed in release "
                       f"{release} (only {kept!r} remains); train a new run, "
                       "or use release 0.1 for this one")
  values = {k: v for k, v in values.items() if k not in REMOVED}
  unknown = sorted(set(values) - set(FIELD_PART))
  if unknown:
    raise ValueError(f"unknown config field(s) {unknown}; known fields: "
                     f"{sorted(FIELD_PART)}")
  grouped = {part: {} for part in PARTS}
  for name, value in values.items():
    grouped[FIELD_PART[name]][name] = value
  return grouped


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """A run's hyperparameters in three parts that serialize together:
  `model` (what the weights are made for, and how they run), `training`
  (the recipe) and `decoding` (the search's defaults). Presets, --hparams
  and `replace` name fields flat ("d_model", "warmup_steps",
  "beam_size"): the names are unique across the parts."""

  model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
  training: TrainingConfig = dataclasses.field(default_factory=TrainingConfig)
  decoding: DecodingConfig = dataclasses.field(default_factory=DecodingConfig)

  @classmethod
  def from_flat(cls, values: dict) -> "TransformerConfig":
    """From flat field values; each part's other fields keep defaults."""
    return cls(**{part: PARTS[part](**fields)
                  for part, fields in _by_part(values).items()})

  def replace(self, **changes) -> "TransformerConfig":
    """A copy with flat fields changed. d_k and d_v stay as they are; a
    stack depth (num_encoder_layers, num_decoder_layers) that equals
    num_layers follows a change of num_layers unless it is changed too."""
    if "num_layers" in changes:
      for depth in ("num_encoder_layers", "num_decoder_layers"):
        if depth not in changes and (getattr(self.model, depth) ==
                                     self.model.num_layers):
          changes[depth] = changes["num_layers"]
    return dataclasses.replace(self, **{
        part: dataclasses.replace(getattr(self, part), **fields)
        for part, fields in _by_part(changes).items() if fields})

  def flat(self) -> dict:
    """Every field by its flat name."""
    return {name: value for part in PARTS
            for name, value in dataclasses.asdict(getattr(self, part)).items()}

  def to_dict(self) -> dict:
    return {part: dataclasses.asdict(getattr(self, part)) for part in PARTS}

  def to_json(self) -> str:
    return json.dumps(self.to_dict(), indent=2, sort_keys=True)

  @classmethod
  def from_dict(cls, values: dict) -> "TransformerConfig":
    """From `to_dict`'s nesting, or from the flat layout that earlier
    versions saved (their run directories and models load unchanged)."""
    if set(values) <= set(PARTS):
      flat = {}
      for part, fields in values.items():
        flat.update(fields)
        unknown = sorted(set(fields) - set(REMOVED) - {
            f.name for f in dataclasses.fields(PARTS[part])})
        if unknown:
          raise ValueError(f"unknown {part} config field(s) {unknown}")
      return cls.from_flat(flat)
    return cls.from_flat(values)


_BIG = dict(d_model=1024, d_ff=4096, num_heads=16, dropout_rate=0.3,
            train_steps=300000)

# Each preset lists only what differs from TransformerConfig's defaults,
# which are the paper's base model. d_k/d_v are derived unless listed.
PRESETS = {
    "base": {},
    "big": _BIG,
    # Table 3 (A): attention heads, computation kept constant.
    "A1": dict(num_heads=1, d_k=512, d_v=512),
    "A2": dict(num_heads=4, d_k=128, d_v=128),
    "A3": dict(num_heads=16, d_k=32, d_v=32),
    "A4": dict(num_heads=32, d_k=16, d_v=16),
    # Table 3 (B): smaller attention key size.
    "B1": dict(d_k=16),
    "B2": dict(d_k=32),
    # Table 3 (C): bigger and smaller models.
    "C1": dict(num_layers=2),
    "C2": dict(num_layers=4),
    "C3": dict(num_layers=8),
    "C4": dict(d_model=256, d_k=32, d_v=32),
    "C5": dict(d_model=1024, d_k=128, d_v=128),
    "C6": dict(d_ff=1024),
    "C7": dict(d_ff=4096),
    # Table 3 (D): dropout and label smoothing.
    "D1": dict(dropout_rate=0.0),
    "D2": dict(dropout_rate=0.2),
    "D3": dict(label_smoothing=0.0),
    "D4": dict(label_smoothing=0.2),
    # Table 3 (E): learned positional embedding instead of sinusoids.
    "E": dict(positional_encoding="learned"),
    # Section 6.3: English constituency parsing, otherwise the base model.
    "parsing": dict(num_layers=4, d_model=1024, vocab_size=16000,
                    beam_size=21, length_penalty_alpha=0.3,
                    max_decode_length_offset=300),
    # Small corpora on a CPU: Multi30k's 29k caption pairs train to a useful
    # model in 20 minutes on 2 cores (docs/recipes.md); not a paper setting.
    # A short warm-up and batches of 4,096 tokens give the many updates a
    # small corpus needs within minutes; eq. 3's rate halved (peak 1.6e-3),
    # which scored 2.5 val BLEU more in 20 minutes than the full rate. A
    # length penalty alpha of 1.0 (section 6.1 used 0.6): these models stop
    # short, and 1.0 scored 0.2-0.5 val BLEU more on each Multi30k model
    # tried, from 677 to 2,200 steps (docs/recipes.md).
    "small_corpus": dict(vocab_size=8000, num_layers=3, d_model=256,
                         d_ff=1024, num_heads=4, max_length=256,
                         warmup_steps=400, learning_rate_scale=0.5,
                         train_steps=100000, batch_tokens=4096,
                         length_penalty_alpha=1.0),
    # Small enough for tests and CPU demos; not a paper setting.
    "tiny": dict(vocab_size=1000, num_layers=2, d_model=64, d_ff=256,
                 num_heads=4, max_length=128, warmup_steps=400,
                 train_steps=2000, batch_tokens=4096),
}

# Table 3's "params x 10^6" column, for the rows that list one.
TABLE3_PARAMS_MILLIONS = {
    "base": 65, "B1": 58, "B2": 60, "C1": 36, "C2": 50, "C3": 80, "C4": 28,
    "C5": 168, "C6": 53, "C7": 90, "big": 213,
}


def _parse_value(field: dataclasses.Field, text: str):
  text = text.strip()
  kind = str(field.type)  # "<class 'int'>", "typing.Optional[int]", ...
  if text.lower() == "none" and "Optional" in kind:
    return None
  try:
    if "bool" in kind:
      if text.lower() in ("true", "1", "yes"):
        return True
      if text.lower() in ("false", "0", "no"):
        return False
      raise ValueError("expected true or false")
    if "int" in kind:
      return int(text)
    if "float" in kind:
      return float(text)
    return text
  except ValueError as e:
    raise ValueError(f"hparam {field.name}={text!r}: {e}") from None


def parse_overrides(overrides: str) -> dict:
  """Parses "name=value,name=value" into typed config values."""
  fields = {f.name: f for cls in PARTS.values()
            for f in dataclasses.fields(cls)}
  values = {}
  for item in filter(None, (s.strip() for s in (overrides or "").split(","))):
    name, sep, text = item.partition("=")
    name = name.strip()
    if not sep:
      raise ValueError(f"hparam {item!r}: expected name=value")
    if name in REMOVED:
      raise ValueError(f"hparam {name!r}: removed in release "
                       f"{REMOVED[name][1]}")
    if name not in fields:
      raise ValueError(f"hparam {name!r} is not a config field; known fields:"
                       f" {sorted(fields)}")
    values[name] = _parse_value(fields[name], text)
  return values


def get_config(name: str = "base", overrides: str = "",
               **changes) -> TransformerConfig:
  """The preset `name` with `overrides` ("d_model=256,...") and `changes`."""
  if name not in PRESETS:
    raise ValueError(f"unknown config preset {name!r}; presets: "
                     f"{sorted(PRESETS)}")
  values = dict(PRESETS[name])
  values.update(parse_overrides(overrides))
  values.update(changes)
  return TransformerConfig.from_flat(values)


# What `--config=auto` (bin/train.py's default) trains, by the training
# pairs (below, preset): the paper's base model is made for WMT's 4.5M
# pairs; on tens of thousands of pairs it overfits and trains too slowly on
# a CPU. More dropout for a few thousand pairs was measured and lost at 20
# minutes (docs/recipes.md#your-own-small-corpus).
AUTO_PRESETS = ((1_000_000, "small_corpus"), (float("inf"), "base"))


@dataclasses.dataclass(frozen=True)
class AutoConfig:
  """A config chosen by the training corpus's size (`AUTO_PRESETS`), with
  `overrides` (--hparams) and `changes` (flags such as train_steps) on top,
  resolved once the pairs are counted (`resolve`)."""
  overrides: str = ""
  changes: tuple = ()  # (field, value) pairs

  def resumed(self, saved):
    """The config a run saved when it started (`saved`, however it was
    chosen), with `overrides` and `changes` on top: what a resumed run
    asks for."""
    return TransformerConfig.from_flat({
        **saved.flat(), **parse_overrides(self.overrides),
        **dict(self.changes)})

  def resolve(self, num_pairs):
    """(TransformerConfig, the reason for it, one line)."""
    below, name = next(e for e in AUTO_PRESETS if num_pairs < e[0])
    config = get_config(name, self.overrides, **dict(self.changes))
    return config, (f"--config=auto: {name} for {num_pairs:,} training "
                    + (f"pairs (fewer than {below:,})"
                       if below != float("inf") else "pairs"))
