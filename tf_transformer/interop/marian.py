"""Transformers' `MarianMTModel` directories (config.json, model.safetensors,
vocab.json, source.spm and target.spm, as `save_pretrained` writes them and
the OPUS-MT models on the Hugging Face hub ship): imported as this project's
`Transformer` (`from_transformers`) and written from it (`export`).

Published Marian models (OPUS-MT; Tiedemann & Thottingal, 2020) are the
paper's post-norm encoder-decoder (section 3) with [sin | cos] sinusoids, a
zero-vector decoder start (a learned BOS in this project's own exports),
swish, relu or gelu feed-forwards and a bias on the logits (`ModelConfig`).

    imported = marian.from_transformers("opus-mt-en-de/")
    path = marian.export(model, vocabulary, "exports/hf", options,
                         max_input_tokens=256)

Importing: the vocabulary is Marian's, reordered so that its <pad>, <unk>
and </s> take `special_ids`' PAD, UNK and EOS; the piece Marian numbers
first after its specials takes BOS_ID (an ordinary piece: the decoder starts
from a zero vector, as Transformers' does from its all-zero <pad> row), the
others keep their order (`vocabulary_order`). What this model cannot hold
exactly is refused in one line that names the setting; nothing is
approximated.

Exporting: `MarianTokenizer` and `MarianMTModel` load the directory with no
code of ours: config.json and generation_config.json (every special id
set), model.safetensors, vocab.json (each piece at our id), source.spm and
target.spm (the SentencePiece models the pieces came from) and
tokenizer_config.json. Writing needs `safetensors` (the "marian" extra), not
torch or Transformers. Transformers' Marian is the paper's post-norm
Transformer (section 3.1) with embeddings scaled by sqrt(d_model) (3.4) and
one head size d_model / h (3.2.2). Its sinusoids are section 3.5's with all
sines before all cosines; a model with the paper's interleaved ones exports
exactly by permuting the d_model axis of every weight
(`interleaved_to_halves`): layer normalization, the residual sums and every
product over d_model are unchanged by a permutation applied to all of them
at once. Its layer normalization's epsilon is fixed at 1e-5 (ours 1e-6
unless imported), which moves a log-probability by well under 1e-4. What it
cannot hold (pre-norm, learned positions, d_k or d_v other than
d_model / h) is refused in one line.
"""

import json
import math
import os

import numpy as np

from tf_transformer import special_ids
from tf_transformer import whole_dir
from tf_transformer.config import TransformerConfig
from tf_transformer.data.marian_vocabulary import MarianVocabulary
from tf_transformer.data.marian_vocabulary import vocabulary_order
from tf_transformer.interop.common import (
    Imported, Weights, assign, refuse, vocabulary_pieces)
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


def _read_json(path):
  if not os.path.exists(path):
    refuse(path, "missing (a Transformers MarianMTModel directory has "
            f"{CONFIG}, {SAFETENSORS} and {VOCABULARY})")
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except (ValueError, UnicodeDecodeError) as e:
    refuse(path, f"not JSON ({e})")


def config_fields(hf, path, bos=None):
  """The `ModelConfig` fields of a Transformers Marian config.

  Args:
    hf: config.json's dict.
    path: its path, for errors.
    bos: the published id that takes our BOS_ID (`vocabulary_order`): a
      decoder that starts from it (as `export` writes ours)
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
  for a, b in (("encoder_attention_heads", "decoder_attention_heads"),
               ("encoder_ffn_dim", "decoder_ffn_dim")):
    if hf[a] != hf[b]:
      refuse(path, f"{a}={hf[a]} and {b}={hf[b]}: the encoder and decoder "
              "share one num_heads and d_ff here")
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
      num_encoder_layers=hf["encoder_layers"],
      num_decoder_layers=hf["decoder_layers"],
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
  fields, notes = config_fields(hf, config_path, int(order[BOS_ID]))
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


# Exporting: the format's name in --format.
FORMAT = "transformers"
# Our activations (config.ACTIVATIONS) by Transformers' names.
HF_ACTIVATIONS = {"relu": "relu", "swish": "swish", "gelu": "gelu",
                  "gelu_tanh": "gelu_new"}
TOKENIZER_FILES = ("source.spm", "target.spm")


def refusal(model) -> str:
  """Why `model` cannot be a `MarianMTModel` (one line), or None."""
  config = model.config.model
  if config.norm_position != "post":
    return (f"norm_position={config.norm_position!r}: Transformers' "
            "MarianMTModel is post-norm only")
  if config.positional_encoding in ("learned", "sinusoidal_opennmt"):
    return (f"positional_encoding={config.positional_encoding!r}: "
            "Transformers' MarianMTModel has section 3.5's sinusoids only")
  if not config.source_eos:
    return ("source_eos=False: MarianTokenizer ends every source with "
            "</s>")
  for field in ("d_k", "d_v"):
    if getattr(config, field) * config.num_heads != config.d_model:
      return (f"{field}={getattr(config, field)} with num_heads="
              f"{config.num_heads}, d_model={config.d_model}: Transformers' "
              "MarianMTModel has d_k = d_v = d_model / num_heads")
  if config.d_model % 2:
    return f"d_model={config.d_model}: the sinusoids need an even width"
  named = model.named_weights()
  if not math.isclose(named.embedding_scale, math.sqrt(config.d_model),
                      rel_tol=1e-6):
    return (f"an embedding scale of {named.embedding_scale}: Transformers' "
            "MarianMTModel scales by sqrt(d_model)")
  if config.decoder_start == "zero" and np.any(
      np.asarray(named.target_embedding)[special_ids.PAD_ID]):
    return ("decoder_start='zero' with a non-zero <pad> row: Transformers "
            "starts the decoder from <pad>'s embedding")
  return None


def interleaved_to_halves(d_model) -> np.ndarray:
  """The permutation of the d_model axis that turns section 3.5's
  interleaved sinusoids [sin_0, cos_0, sin_1, ...] into Transformers'
  halves [sin_0, sin_1, ..., cos_0, cos_1, ...]: new[k] = old[p[k]]."""
  return np.concatenate([np.arange(0, d_model, 2), np.arange(1, d_model, 2)])


def _affine(tensors, name, affine, axis_in, axis_out):
  """`name`.weight [out, in] and `name`.bias from a kernel [in, out],
  each axis permuted by `axis_in` / `axis_out` (None: not d_model)."""
  kernel = np.asarray(affine.kernel, np.float32)
  bias = np.asarray(affine.bias, np.float32)
  if axis_in is not None:
    kernel = kernel[axis_in, :]
  if axis_out is not None:
    kernel, bias = kernel[:, axis_out], bias[axis_out]
  tensors[f"{name}.weight"] = np.ascontiguousarray(kernel.T)
  tensors[f"{name}.bias"] = np.ascontiguousarray(bias)


def _norm(tensors, name, norm, order):
  tensors[f"{name}.weight"] = np.asarray(norm.gamma, np.float32)[order]
  tensors[f"{name}.bias"] = np.asarray(norm.beta, np.float32)[order]


def _attention(tensors, name, attention, order):
  for theirs, ours in (("q_proj", "query"), ("k_proj", "key"),
                       ("v_proj", "value")):
    _affine(tensors, f"{name}.{theirs}", getattr(attention, ours), order,
            None)
  _affine(tensors, f"{name}.out_proj", attention.output, None, order)


def _layer(tensors, prefix, layer, order):
  """One encoder or decoder layer by Transformers' Marian names."""
  _attention(tensors, f"{prefix}.self_attn", layer.self_attention, order)
  _norm(tensors, f"{prefix}.self_attn_layer_norm", layer.self_attention_norm,
        order)
  if layer.cross_attention is not None:
    _attention(tensors, f"{prefix}.encoder_attn", layer.cross_attention,
               order)
    _norm(tensors, f"{prefix}.encoder_attn_layer_norm",
          layer.cross_attention_norm, order)
  _affine(tensors, f"{prefix}.fc1", layer.feed_forward.inner, order, None)
  _affine(tensors, f"{prefix}.fc2", layer.feed_forward.outer, None, order)
  _norm(tensors, f"{prefix}.final_layer_norm", layer.feed_forward_norm, order)


def state_dict(model) -> dict:
  """{name: float32 array} of `MarianMTModel`'s tensors (as
  `save_pretrained` writes them: tied matrices once, no sinusoid tables)
  holding `model`'s weights."""
  config = model.config.model
  named = model.named_weights()
  order = (interleaved_to_halves(config.d_model)
           if config.positional_encoding == "sinusoidal"
           else np.arange(config.d_model))
  matrix = lambda m: np.ascontiguousarray(np.asarray(m, np.float32)[:, order])
  tensors = {}
  if config.share_embeddings:
    tensors["model.shared.weight"] = matrix(named.source_embedding)
  else:
    tensors["model.encoder.embed_tokens.weight"] = matrix(
        named.source_embedding)
    tensors["model.decoder.embed_tokens.weight"] = matrix(
        named.target_embedding)
    tensors["lm_head.weight"] = matrix(named.output_embedding)
  bias = (np.zeros(config.vocab_size, np.float32)
          if named.output_bias is None else np.asarray(named.output_bias,
                                                       np.float32))
  tensors["final_logits_bias"] = bias[None, :]
  for stack, prefix in ((named.encoder, "model.encoder"),
                        (named.decoder, "model.decoder")):
    for i, layer in enumerate(stack.layers):
      _layer(tensors, f"{prefix}.layers.{i}", layer, order)
  return tensors


def _ids(config) -> dict:
  """The special ids config.json and generation_config.json both set: the
  decoder starts from our BOS, or from <pad>'s zero row (Marian's); EOS is
  not forced at the length limit, where our searches cut a sentence as it
  stands (MarianConfig's default would force id 0)."""
  start = (special_ids.PAD_ID if config.decoder_start == "zero"
           else special_ids.BOS_ID)
  return {"pad_token_id": special_ids.PAD_ID,
          "eos_token_id": special_ids.EOS_ID, "forced_eos_token_id": None,
          "bos_token_id": start, "decoder_start_token_id": start}


def model_config(model) -> dict:
  """config.json: a `MarianConfig` with every id set."""
  config = model.config.model
  return {
      "architectures": ["MarianMTModel"], "model_type": "marian",
      "is_encoder_decoder": True,
      "vocab_size": config.vocab_size,
      "decoder_vocab_size": config.vocab_size,
      "d_model": config.d_model,
      "encoder_layers": config.num_encoder_layers,
      "decoder_layers": config.num_decoder_layers,
      "encoder_attention_heads": config.num_heads,
      "decoder_attention_heads": config.num_heads,
      "encoder_ffn_dim": config.d_ff, "decoder_ffn_dim": config.d_ff,
      "activation_function": HF_ACTIVATIONS[config.activation],
      "max_position_embeddings": config.max_length,
      "scale_embedding": True,
      "share_encoder_decoder_embeddings": config.share_embeddings,
      "tie_word_embeddings": config.share_embeddings,
      "dropout": config.dropout_rate,
      "attention_dropout": config.attention_dropout_rate,
      "activation_dropout": 0.0,
      "encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0,
      "init_std": 0.02, "use_cache": True, **_ids(config),
  }


def generation_config(model, options) -> dict:
  """generation_config.json: the ids, the never-output ones banned (as every
  search of ours bans them) and the beam size. (Transformers' length
  penalty divides by length^alpha, not section 6.1's GNMT penalty: left at
  its default.)"""
  config = model.config.model
  return {
      **_ids(config),
      "bad_words_ids": [[i] for i in special_ids.never_output(
          config.decoder_start)],
      "num_beams": options.beam_size, "max_length": config.max_length,
  }


def tokenizer_files(vocabulary, max_input_tokens) -> dict:
  """{name: bytes}: source.spm, target.spm, vocab.json (each piece at our
  id, so `MarianTokenizer`'s ids are the model's) and tokenizer_config.json
  (`MarianTokenizer` with our special pieces)."""
  if isinstance(vocabulary, MarianVocabulary):
    files = {name: vocabulary.files[name] for name in TOKENIZER_FILES}
  else:
    files = {name: vocabulary.model_proto for name in TOKENIZER_FILES}
  pieces = vocabulary_pieces(vocabulary)
  files["vocab.json"] = json.dumps(
      {piece: i for i, piece in enumerate(pieces)}, ensure_ascii=False,
      indent=0).encode("utf-8")
  files["tokenizer_config.json"] = json.dumps({
      "tokenizer_class": "MarianTokenizer",
      "model_max_length": max_input_tokens, "separate_vocabs": False,
      "unk_token": pieces[special_ids.UNK_ID],
      "eos_token": pieces[special_ids.EOS_ID],
      "pad_token": pieces[special_ids.PAD_ID]}, indent=2).encode("utf-8")
  return files


def export(model, vocabulary, output_dir, options, max_input_tokens=256):
  """Writes the `MarianMTModel` directory `output_dir` whole (replacing one
  that is there); returns its path.

  Args:
    model: a `Transformer` (its `named_weights()` are read).
    vocabulary: its `Vocabulary` or an imported `MarianVocabulary`.
    output_dir: the directory to write.
    options: `DecodingOptions`, for generation_config.json's beam size.
    max_input_tokens: the tokenizer's `model_max_length`.
  Returns:
    output_dir.
  Raises:
    ValueError naming what Transformers' Marian cannot hold.
    ImportError where `safetensors` is not installed.
  """
  why = refusal(model)
  if why:
    raise ValueError(f"--format={FORMAT}: {why}")
  try:
    from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ImportError(f"--format={FORMAT} needs safetensors: pip install -e "
                      "\".[marian]\"") from None
  tensors = state_dict(model)
  with whole_dir.written(output_dir) as tmp:
    save_file(tensors, os.path.join(tmp, SAFETENSORS),
              metadata={"format": "pt"})
    for name, data in ((CONFIG, model_config(model)),
                       ("generation_config.json",
                        generation_config(model, options))):
      with open(os.path.join(tmp, name), "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)
    for name, data in tokenizer_files(vocabulary, min(
        max_input_tokens, model.config.model.max_length)).items():
      with open(os.path.join(tmp, name), "wb") as f:
        f.write(data)
  return output_dir
