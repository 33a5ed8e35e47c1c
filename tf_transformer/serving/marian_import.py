"""Published Marian models (OPUS-MT; Tiedemann & Thottingal, 2020) as this
project's `Transformer`: the paper's post-norm encoder-decoder (section 3)
with [sin | cos] sinusoids, a zero-vector decoder start (a learned BOS in
this project's own exports, `transformers_export`), swish, relu or gelu
feed-forwards and a bias on the logits (`ModelConfig`), read from a
Transformers `MarianMTModel` directory (config.json, model.safetensors and
vocab.json, as `save_pretrained` writes them).

    model, notes = marian_import.from_transformers("opus-mt-en-de/")

The vocabulary is Marian's, reordered so that its <pad>, <unk> and </s> take
`special_ids`' PAD, UNK and EOS; the piece Marian numbers first after its
specials takes BOS_ID (an ordinary piece: the decoder starts from a zero
vector, as Transformers' does from its all-zero <pad> row), the others keep
their order (`vocabulary_order`). What this model cannot hold exactly is
refused in one line that names the setting; nothing is approximated.
"""

import json
import os
import typing

import numpy as np

from tf_transformer.config import TransformerConfig
from tf_transformer.data.marian_vocabulary import vocabulary_order
from tf_transformer.special_ids import BOS_ID

CONFIG = "config.json"
VOCABULARY = "vocab.json"
SAFETENSORS = "model.safetensors"
PYTORCH = "pytorch_model.bin"
ACTIVATIONS = {"relu": "relu", "swish": "swish", "silu": "swish",
               "gelu": "gelu", "gelu_new": "gelu_tanh",
               "gelu_pytorch_tanh": "gelu_tanh"}
# Settings of other BART-family configs that a Marian one may carry, and the
# value this model matches.
MUST_BE = {"scale_embedding": True, "normalize_before": False,
           "add_final_layer_norm": False, "normalize_embedding": False,
           "static_position_embeddings": True, "add_bias_logits": False}


class Imported(typing.NamedTuple):
  """An imported model: the `Transformer`, `order` (our id -> the
  published model's id, `vocabulary_order`) and `notes`, lines on what
  differs from the published model in training only."""
  model: typing.Any
  order: np.ndarray
  notes: tuple


def refuse(path, why):
  raise ValueError(f"{path}: {why}")


def _read_json(path):
  if not os.path.exists(path):
    refuse(path, "missing (a Transformers MarianMTModel directory has "
            f"{CONFIG}, {SAFETENSORS} and {VOCABULARY})")
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except (ValueError, UnicodeDecodeError) as e:
    refuse(path, f"not JSON ({e})")


def model_config(hf, path, bos=None):
  """The `ModelConfig` fields of a Transformers Marian config.

  Args:
    hf: config.json's dict.
    path: its path, for errors.
    bos: the published id that takes our BOS_ID (`vocabulary_order`): a
      decoder that starts from it (as `transformers_export` writes ours)
      starts from a learned BOS here.
  Returns:
    (fields, notes): the fields, and lines on training-only differences.
  Raises:
    ValueError naming the setting this model cannot represent exactly.
  """
  if hf.get("model_type") != "marian":
    refuse(path, f"model_type={hf.get('model_type')!r}: only Marian "
            "models (model_type 'marian', MarianMTModel) are imported")
  for name, value in MUST_BE.items():
    if name in hf and bool(hf[name]) != value:
      refuse(path, f"{name}={hf[name]!r}: this model needs {value}")
  for a, b in (("encoder_layers", "decoder_layers"),
               ("encoder_attention_heads", "decoder_attention_heads"),
               ("encoder_ffn_dim", "decoder_ffn_dim")):
    if hf[a] != hf[b]:
      refuse(path, f"{a}={hf[a]} and {b}={hf[b]}: the encoder and decoder "
              "share one num_layers, num_heads and d_ff here")
  activation = ACTIVATIONS.get(hf.get("activation_function"))
  if activation is None:
    refuse(path, f"activation_function={hf.get('activation_function')!r}: "
            f"one of {sorted(ACTIVATIONS)}")
  share = hf.get("share_encoder_decoder_embeddings", True)
  decoder_vocab = hf.get("decoder_vocab_size") or hf["vocab_size"]
  if decoder_vocab != hf["vocab_size"]:
    refuse(path, f"decoder_vocab_size={decoder_vocab} and vocab_size="
            f"{hf['vocab_size']}: one joint vocabulary here")
  start = hf.get("decoder_start_token_id", hf["pad_token_id"])
  if start not in (hf["pad_token_id"], bos):
    refuse(path, f"decoder_start_token_id={start}: the decoder starts "
            f"from <pad>'s zero vector (pad_token_id={hf['pad_token_id']}) "
            f"or from the first piece after the specials ({bos}) here")
  fields = dict(
      vocab_size=hf["vocab_size"], num_layers=hf["encoder_layers"],
      d_model=hf["d_model"], d_ff=hf["encoder_ffn_dim"],
      num_heads=hf["encoder_attention_heads"],
      positional_encoding="sinusoidal_halves",
      max_length=hf["max_position_embeddings"], share_embeddings=share,
      norm_position="post", layer_norm_epsilon=1e-5,  # torch's LayerNorm
      activation=activation,
      decoder_start="zero" if start == hf["pad_token_id"] else "bos",
      output_bias=True,
      dropout_rate=hf.get("dropout", 0.1),
      attention_dropout_rate=hf.get("attention_dropout", 0.0))
  notes = []
  if hf.get("activation_dropout"):
    notes.append(f"activation_dropout={hf['activation_dropout']} is not "
                 "applied when this model is fine-tuned (no such dropout "
                 "here)")
  return fields, tuple(notes)


def read_weights(directory):
  """{name: float32 array} of model.safetensors, else pytorch_model.bin
  (only where torch is installed; loaded with weights_only=True)."""
  path = os.path.join(directory, SAFETENSORS)
  if os.path.exists(path):
    from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
    try:
      tensors = load_file(path)
    except Exception as e:  # pylint: disable=broad-except
      refuse(path, f"unreadable safetensors file ({e})")
  else:
    path = os.path.join(directory, PYTORCH)
    if not os.path.exists(path):
      refuse(directory, f"no weights: neither {SAFETENSORS} nor {PYTORCH}")
    try:
      import torch  # pylint: disable=g-import-not-at-top
    except ImportError:
      refuse(path, f"reading it needs torch; install torch, or save the "
              f"model with safetensors ({SAFETENSORS})")
    try:
      state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # pylint: disable=broad-except
      refuse(path, f"unreadable ({e})")
    tensors = {k: v.float().numpy() for k, v in state.items()}
  return {k: np.asarray(v, np.float32) for k, v in tensors.items()}, path


def _special_ids(directory, hf, vocab_size):
  """(pad, unk, eos) of vocab.json, checked against config.json."""
  path = os.path.join(directory, VOCABULARY)
  vocab = _read_json(path)
  if len(vocab) != vocab_size:
    refuse(path, f"{len(vocab)} pieces, but config.json's vocab_size is "
            f"{vocab_size}")
  for piece, key in (("<pad>", "pad_token_id"), ("</s>", "eos_token_id")):
    if vocab.get(piece) != hf[key]:
      refuse(path, f"{piece} is {vocab.get(piece)}, config.json's {key} "
              f"{hf[key]}")
  if "<unk>" not in vocab:
    refuse(path, "no <unk> piece")
  return hf["pad_token_id"], vocab["<unk>"], hf["eos_token_id"]


class Weights:
  """The published tensors by name, each taken once, checked for shape."""

  def __init__(self, tensors, path):
    self.tensors, self.path, self.used = tensors, path, set()

  def get(self, name, shape, transpose=False):
    if name not in self.tensors:
      refuse(self.path, f"no tensor {name!r}")
    value = self.tensors[name]
    value = value.T if transpose else value
    if tuple(value.shape) != tuple(shape):
      refuse(self.path, f"{name} has shape {value.shape}, the config "
              f"makes it {tuple(shape)}")
    self.used.add(name)
    return value


def assign(variable, value):
  variable.assign(value.astype(np.float32))


def _assign_attention(weights, prefix, attention):
  for ours, theirs in (("query", "q_proj"), ("key", "k_proj"),
                       ("value", "v_proj"), ("output", "out_proj")):
    affine = getattr(attention, ours)
    assign(affine.kernel, weights.get(f"{prefix}.{theirs}.weight",
                                       affine.kernel.shape, transpose=True))
    assign(affine.bias, weights.get(f"{prefix}.{theirs}.bias",
                                     affine.bias.shape))


def _assign_norm(weights, prefix, norm):
  assign(norm.gamma, weights.get(f"{prefix}.weight", norm.gamma.shape))
  assign(norm.beta, weights.get(f"{prefix}.bias", norm.beta.shape))


def _assign_layer(weights, prefix, layer):
  """One `named_weights.Layer` from a Marian layer's tensors."""
  _assign_attention(weights, f"{prefix}.self_attn", layer.self_attention)
  _assign_norm(weights, f"{prefix}.self_attn_layer_norm",
               layer.self_attention_norm)
  if layer.cross_attention is not None:
    _assign_attention(weights, f"{prefix}.encoder_attn",
                      layer.cross_attention)
    _assign_norm(weights, f"{prefix}.encoder_attn_layer_norm",
                 layer.cross_attention_norm)
  for ours, theirs in (("inner", "fc1"), ("outer", "fc2")):
    affine = getattr(layer.feed_forward, ours)
    assign(affine.kernel, weights.get(f"{prefix}.{theirs}.weight",
                                       affine.kernel.shape, transpose=True))
    assign(affine.bias, weights.get(f"{prefix}.{theirs}.bias",
                                     affine.bias.shape))
  _assign_norm(weights, f"{prefix}.final_layer_norm", layer.feed_forward_norm)


def _embeddings(weights, hf, order, d_model):
  """(source, target, output) matrices in our vocabulary's order, and
  notes."""
  vocab_size = hf["vocab_size"]
  shape = (vocab_size, d_model)
  if hf.get("share_encoder_decoder_embeddings", True):
    shared = weights.get("model.shared.weight", shape)
    source = target = shared
    for copy in ("model.encoder.embed_tokens.weight",
                 "model.decoder.embed_tokens.weight"):
      if copy in weights.tensors and not np.array_equal(
          weights.get(copy, shape), shared):
        refuse(weights.path, f"{copy} differs from model.shared.weight, "
                "though share_encoder_decoder_embeddings is true")
  else:
    source = weights.get("model.encoder.embed_tokens.weight", shape)
    target = weights.get("model.decoder.embed_tokens.weight", shape)
  notes = ()
  if "lm_head.weight" in weights.tensors:
    output = weights.get("lm_head.weight", shape)
  elif hf.get("tie_word_embeddings", True):
    output = target
  else:
    refuse(weights.path, "no tensor 'lm_head.weight' and "
            "tie_word_embeddings=false")
  if hf.get("share_encoder_decoder_embeddings", True):
    if output is not source and not np.array_equal(output, source):
      refuse(weights.path, "lm_head.weight differs from model.shared.weight"
              ": this model ties the output projection to the shared "
              "embeddings")
  elif output is target or np.array_equal(output, target):
    notes = ("the decoder's embeddings and output projection are one "
             "matrix in the published model, two equal ones here: "
             "fine-tuning updates them apart",)
  pad = hf["pad_token_id"]
  if hf.get("decoder_start_token_id", pad) == pad and np.any(target[pad]):
    refuse(weights.path, f"the decoder's <pad> row ({pad}) is not zero: "
            "the decoder starts from a zero vector here")
  return source[order], target[order], output[order], notes


def from_transformers(directory, dtype=None) -> Imported:
  """A Transformers `MarianMTModel` directory as a built `Transformer`.

  Args:
    directory: holds config.json, model.safetensors (or pytorch_model.bin)
      and vocab.json, as `save_pretrained` and the OPUS-MT releases on the
      Hugging Face hub have them.
    dtype: a Keras dtype policy for the model; None: the global one.
  Returns:
    `Imported`: the model, whose log-probabilities are the published
    model's (ids reordered by `order`), and notes.
  Raises:
    ValueError naming the file and the setting or tensor it cannot import.
  """
  from tf_transformer.model import build_model  # pylint: disable=g-import-not-at-top
  config_path = os.path.join(directory, CONFIG)
  hf = _read_json(config_path)
  order = vocabulary_order(hf["vocab_size"],
                           *_special_ids(directory, hf, hf["vocab_size"]))
  fields, notes = model_config(hf, config_path, int(order[BOS_ID]))
  tensors, weights_path = read_weights(directory)
  weights = Weights(tensors, weights_path)
  config = TransformerConfig.from_flat(fields)
  model = build_model(config, dtype)
  named = model.named_weights()
  source, target, output, more_notes = _embeddings(weights, hf, order,
                                                   fields["d_model"])
  assign(named.source_embedding, source)
  if not fields["share_embeddings"]:
    assign(named.target_embedding, target)
    assign(named.output_embedding, output)
  bias = weights.get("final_logits_bias", (1, hf["vocab_size"]))
  assign(named.output_bias, bias[0][order])
  for stack, prefix in ((named.encoder, "model.encoder"),
                        (named.decoder, "model.decoder")):
    for i, layer in enumerate(stack.layers):
      _assign_layer(weights, f"{prefix}.layers.{i}", layer)
  unused = sorted(set(tensors) - weights.used - {
      "model.encoder.embed_positions.weight",
      "model.decoder.embed_positions.weight"})
  if unused:
    refuse(weights_path, f"tensors this model has no place for: "
            f"{unused[:5]}{' ...' if len(unused) > 5 else ''}")
  return Imported(model, order, notes + more_notes)
