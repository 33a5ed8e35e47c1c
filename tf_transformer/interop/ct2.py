"""CTranslate2 model directories: the same trained weights for the C++
inference engine OpenNMT-tf users serve with (and our speed yardstick).
`translators/ct2_runtime.py` translates with them.

    path = ct2.export(model, vocabulary, "saved_models/multi30k_ct2",
                      options, max_input_tokens=256)

The directory is self-contained: CTranslate2's `model.bin`, `config.json`
and `shared_vocabulary.json`, plus `vocabulary.model` (the SentencePiece
model, so clients tokenize exactly as training did; an imported Marian
model's `marian/` folder instead) and
`tf_transformer.json` (the search of `DecodingOptions` and the input limit,
which CTranslate2 takes per call rather than from the model, and the decoder
layer whose attention it returns for word alignments).

What the spec states, each one a difference from CTranslate2's defaults that
would otherwise change every output:
- post-norm blocks (section 3.1), ReLU in the feed-forward network (eq. 2);
- the sinusoid table of section 3.5 interleaved as this project computes it
  (CTranslate2's own puts all sines before all cosines), written out row by
  row; or the learned table (Table 3 row E);
- embeddings scaled by sqrt(d_model) (3.4) and the output projection tied to
  the embedding matrix (no bias);
- the SentencePiece pieces in id order as the vocabulary, so the special ids
  (PAD 0, UNK 1, BOS 2, EOS 3) keep their meaning, BOS starting the decoder
  and EOS appended to every source (`add_source_eos`) unless the model
  reads its source without (`ModelConfig.source_eos`);
- Keras kernels are [in, out]; CTranslate2's linear weights are [out, in];
  the Q, K, V projections of self-attention are fused into one matrix, and
  the K, V projections of encoder-decoder attention into another;
- the attention CTranslate2 returns (`return_attention`, for word
  alignments): one decoder layer's encoder-decoder attention averaged over
  all its heads, as the SavedModel's `alignment` signature averages them
  (CTranslate2's default is the last layer's first head). CTranslate2 keeps
  one layer's, so the layer is chosen here (default: the last).

`ctranslate2` is an optional dependency (`pip install -e ".[ctranslate2]"`).
"""

import dataclasses
import json
import os

import numpy as np

from tf_transformer import whole_dir
from tf_transformer.data import shortlist_table
from tf_transformer.interop.common import vocabulary_pieces
from tf_transformer.layers.embedding import sinusoid_table
from tf_transformer.special_ids import BOS_ID, EOS_ID, UNK_ID

DECODING_FILE = "tf_transformer.json"
MODEL_FILE = "model.bin"  # what tells a CTranslate2 directory apart
VMAP_FILE = "vmap.txt"  # CTranslate2's name for a vocabulary map

# Positions a sinusoidal model may meet: CTranslate2 needs the table as rows.
SINUSOID_ROWS = 1024


def is_ct2_model(path) -> bool:
  """Whether `path` is a CTranslate2 model directory (it has MODEL_FILE)."""
  return os.path.isfile(os.path.join(path, MODEL_FILE))


def import_ctranslate2():
  """The ctranslate2 module; ImportError saying how to install it."""
  try:
    import ctranslate2  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError("a CTranslate2 model needs the ctranslate2 package: "
                      'pip install -e ".[ctranslate2]"') from e
  return ctranslate2


def _specs():
  ctranslate2 = import_ctranslate2()
  return ctranslate2.specs.common_spec, ctranslate2.specs.transformer_spec


def _set_linear(spec, *affines):
  """One CTranslate2 linear from one or more named affine maps
  (`named_weights.Affine`, kernels [in, out]), fused along the output axis
  (CTranslate2's weights are [out, in])."""
  spec.weight = np.concatenate([np.asarray(a.kernel).T for a in affines],
                               axis=0)
  spec.bias = np.concatenate([np.asarray(a.bias) for a in affines], axis=0)


def _set_norm(spec, norm):
  spec.gamma, spec.beta = np.asarray(norm.gamma), np.asarray(norm.beta)


def _set_layer(spec, layer):
  """An encoder or decoder layer's spec from its `named_weights.Layer`."""
  attention = layer.self_attention
  _set_linear(spec.self_attention.linear[0], attention.query, attention.key,
              attention.value)
  _set_linear(spec.self_attention.linear[1], attention.output)
  _set_norm(spec.self_attention.layer_norm, layer.self_attention_norm)
  if layer.cross_attention is not None:
    cross = layer.cross_attention
    _set_linear(spec.attention.linear[0], cross.query)
    _set_linear(spec.attention.linear[1], cross.key, cross.value)
    _set_linear(spec.attention.linear[2], cross.output)
    _set_norm(spec.attention.layer_norm, layer.cross_attention_norm)
  _set_linear(spec.ffn.linear_0, layer.feed_forward.inner)
  _set_linear(spec.ffn.linear_1, layer.feed_forward.outer)
  _set_norm(spec.ffn.layer_norm, layer.feed_forward_norm)


def _positions(table, d_model, max_length, kind):
  """A learned table as it is, or the sinusoids (`kind`'s layout) as rows."""
  if table is not None:
    return np.asarray(table)
  rows = max(SINUSOID_ROWS, max_length)
  return sinusoid_table(np.arange(rows), d_model,
                        kind=kind).numpy()


# Our activations (config.ACTIVATIONS) by CTranslate2's names.
_ACTIVATIONS = {"relu": "RELU", "swish": "SWISH", "gelu": "GELU",
                "gelu_tanh": "GELUTanh"}


def alignment_layer_of(model, alignment_layer=None) -> int:
  """The decoder layer (from 1) whose attention a CTranslate2 export
  returns: `alignment_layer`, or the last. Raises ValueError naming
  --alignment_layer if the decoder has no such layer."""
  num_layers = len(model.named_weights().decoder.layers)
  layer = num_layers if alignment_layer is None else alignment_layer
  if not 1 <= layer <= num_layers:
    raise ValueError(f"--alignment_layer={layer}: the model's decoder has "
                     f"layers 1 to {num_layers}")
  return layer


def build_spec(model, vocabulary, alignment_layer=None):
  """The CTranslate2 TransformerSpec holding `model`'s weights, read from
  `model.named_weights()`; its attention for alignments is decoder layer
  `alignment_layer`'s (from 1; default the last), heads averaged."""
  common_spec, transformer_spec = _specs()
  config = model.config.model
  named = model.named_weights()
  attention = named.encoder.layers[0].self_attention
  heads = attention.num_heads
  d_k = attention.query.kernel.shape[-1] // heads
  d_v = attention.value.kernel.shape[-1] // heads
  if d_k != d_v:
    raise ValueError(f"d_k={d_k} and d_v={d_v}: CTranslate2 has one head "
                     "size for keys and values")
  sizes = dict(num_heads=heads, pre_norm=named.norm_position == "pre",
               activation=getattr(common_spec.Activation,
                                  _ACTIVATIONS[named.activation]))
  if d_k * heads != config.d_model:
    sizes["head_dim"] = d_k
  spec = transformer_spec.TransformerSpec(
      transformer_spec.TransformerEncoderSpec(
          len(named.encoder.layers), **sizes),
      transformer_spec.TransformerDecoderSpec(
          len(named.decoder.layers), **sizes, alignment_heads=heads,
          alignment_layer=alignment_layer_of(model, alignment_layer) - 1))
  encoder, decoder = spec.encoder, spec.decoder
  encoder.embeddings[0].weight = np.asarray(named.source_embedding)
  decoder.embeddings.weight = np.asarray(named.target_embedding)
  decoder.projection.weight = np.asarray(named.output_embedding)
  if named.output_bias is not None:
    decoder.projection.bias = np.asarray(named.output_bias)
  decoder.start_from_zero_embedding = named.decoder_start == "zero"
  encoder.position_encodings.encodings = _positions(
      named.source_positions, config.d_model, config.max_length,
      named.positional_encoding)
  decoder.position_encodings.encodings = _positions(
      named.target_positions, config.d_model, config.max_length,
      named.positional_encoding)
  for layer_spec, layer in zip(encoder.layer, named.encoder.layers):
    _set_layer(layer_spec, layer)
  for layer_spec, layer in zip(decoder.layer, named.decoder.layers):
    _set_layer(layer_spec, layer)
  if named.encoder.final_norm is not None:
    _set_norm(encoder.layer_norm, named.encoder.final_norm)
    _set_norm(decoder.layer_norm, named.decoder.final_norm)

  pieces = vocabulary_pieces(vocabulary)
  spec.register_source_vocabulary(pieces)
  spec.register_target_vocabulary(pieces)
  spec.config.unk_token = pieces[UNK_ID]
  # A zero-vector start (Marian's) embeds no token: BOS_ID is an ordinary
  # piece there, so the start is named by EOS, as CTranslate2's own Marian
  # conversion names it.
  start = EOS_ID if named.decoder_start == "zero" else BOS_ID
  spec.config.bos_token = spec.config.decoder_start_token = pieces[start]
  spec.config.eos_token = pieces[EOS_ID]
  spec.config.add_source_eos = config.source_eos
  spec.config.layer_norm_epsilon = named.epsilon
  return spec


def export(model, vocabulary, output_dir, options, max_input_tokens=256,
           quantization=None, shortlist=None, alignment_layer=None) -> str:
  """Writes the CTranslate2 directory `output_dir` (replacing one that is
  there); returns its path. `quantization`: CTranslate2's weight type
  ("int8", "float16", ...); None keeps float32, which CTranslate2 can still
  run as int8 by `compute_type`. `shortlist`: a `shortlist.Shortlist` of
  arrays, written as CTranslate2's vocabulary map (`vmap.txt`), which the
  runtime then uses (`use_vmap`). `alignment_layer`: the decoder layer
  (from 1; default the last) whose attention, heads averaged, aligns words
  (`ct2_runtime.CT2Decoder.aligned`)."""
  alignment_layer = alignment_layer_of(model, alignment_layer)
  spec = build_spec(model, vocabulary, alignment_layer)
  spec.validate()
  spec.optimize(quantization=quantization)
  with whole_dir.written(output_dir) as tmp:
    spec.save(tmp)
    vocabulary.save(tmp)
    if shortlist is not None:
      with open(os.path.join(tmp, VMAP_FILE), "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in shortlist_table.vmap_lines(
            *shortlist, vocabulary_pieces(vocabulary)))
    with open(os.path.join(tmp, DECODING_FILE), "w", encoding="utf-8") as f:
      json.dump({"decoding": dataclasses.asdict(options),
                 "max_input_tokens": max_input_tokens,
                 "source_eos": model.config.model.source_eos,
                 "alignment_layer": alignment_layer},
                f, indent=2)
  return output_dir
