"""A trained model as a Transformers `MarianMTModel` directory, the format the
Hugging Face Hub and most translation users load (the inverse of
`marian_import`).

    path = transformers_export.export(model, vocabulary, "exports/hf",
                                      options, max_input_tokens=256)

`MarianTokenizer` and `MarianMTModel` load the directory with no code of
ours: config.json and generation_config.json (every special id set),
model.safetensors, vocab.json (each piece at our id), source.spm and
target.spm (the SentencePiece models the pieces came from) and
tokenizer_config.json. Writing needs `safetensors` (the "marian" extra), not
torch or Transformers.

Transformers' Marian is the paper's post-norm Transformer (section 3.1) with
embeddings scaled by sqrt(d_model) (3.4) and one head size d_model / h
(3.2.2). Its sinusoids are section 3.5's with all sines before all cosines;
a model with the paper's interleaved ones exports exactly by permuting the
d_model axis of every weight (`interleaved_to_halves`): layer normalization,
the residual sums and every product over d_model are unchanged by a
permutation applied to all of them at once. Its layer normalization's
epsilon is fixed at 1e-5 (ours 1e-6 unless imported), which moves a
log-probability by well under 1e-4. What it cannot hold (pre-norm, learned
positions, d_k or d_v other than d_model / h) is refused in one line.
"""

import json
import math
import os

import numpy as np

from tf_transformer import special_ids
from tf_transformer import whole_dir
from tf_transformer.data.marian_vocabulary import MarianVocabulary
from tf_transformer.serving import marian_import
from tf_transformer.serving.ct2_export import vocabulary_pieces

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
      "encoder_layers": config.num_layers, "decoder_layers": config.num_layers,
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
    save_file(tensors, os.path.join(tmp, marian_import.SAFETENSORS),
              metadata={"format": "pt"})
    for name, data in ((marian_import.CONFIG, model_config(model)),
                       ("generation_config.json",
                        generation_config(model, options))):
      with open(os.path.join(tmp, name), "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)
    for name, data in tokenizer_files(vocabulary, min(
        max_input_tokens, model.config.model.max_length)).items():
      with open(os.path.join(tmp, name), "wb") as f:
        f.write(data)
  return output_dir
