"""A Marian release (Junczys-Dowmunt et al., 2018), as the OPUS-MT zips
ship it, as this project's `Transformer`: the model `*.npz` with its
`special:model.yml`, one joint `*.vocab.yml`, source.spm and target.spm.

    imported, vocab_json = marian_npz.from_marian("opus-mt-en-de/")

Marian's Transformer is the paper's (section 3): post-norm (or pre-norm
with a final norm) residual blocks, embeddings scaled by sqrt(d_model) and
tied (`Wemb`) or not, [sin | cos] sinusoids, a zero-vector decoder start,
relu or swish feed-forwards, a bias on the logits. Marian's vocabulary has
no padding piece: <pad> is appended as Transformers' converter does, with a
zero embedding and a logit bias of `PAD_LOGIT`, so that the softmax over
Marian's pieces is Marian's. What this model cannot hold exactly is refused
in one line naming the option (`model_config`).

Where this differs from Marian itself (as CTranslate2's and Transformers'
conversions do): the sinusoids' frequencies are 10000^(-2i/d_model) (the
paper's), Marian's 10000^(-i/(d_model/2 - 1)) (docs/serving.md).
"""

import glob
import json
import os

import numpy as np

from tf_transformer.config import TransformerConfig
from tf_transformer.data.marian_vocabulary import vocabulary_order
from tf_transformer.interop.common import (
    Imported, Weights, assign, refuse)

MODEL_YML = "special:model.yml"
# <pad>'s logit: its probability exp(PAD_LOGIT - logsumexp) is below 1e-40
# for a softmax whose largest logit is above -8, so the other pieces' are
# Marian's to float32 precision; finite in float16 and bfloat16, and small
# enough that label smoothing's mean over the logits moves the reported loss
# by only 0.1 * 100 / vocab_size (fine-tuning; docs/serving.md).
PAD_LOGIT = -100.0
ACTIVATIONS = {"relu": "relu", "swish": "swish"}
# Marian's layer norms (layers/generic.h); CTranslate2 computes with 1e-5,
# which only pre-norm models feel (docs/serving.md).
LAYER_NORM_EPSILON = 1e-6


def _yaml(data, path):
  """YAML text as strings only (BaseLoader: a piece such as `no` or `1`
  stays a string)."""
  import yaml  # pylint: disable=g-import-not-at-top
  try:
    return yaml.load(data, Loader=yaml.BaseLoader)
  except yaml.YAMLError as e:
    refuse(path, f"not YAML ({str(e).splitlines()[0]})")


def _flag(yml, name, default="false"):
  return str(yml.get(name, default)).lower() == "true"


def find_files(directory):
  """(model .npz, vocabulary .yml) of a Marian release directory."""
  if not os.path.isdir(directory):
    refuse(directory, "no such directory")
  models = sorted(p for p in glob.glob(os.path.join(directory, "*.npz"))
                  if not p.endswith(".optimizer.npz"))
  if len(models) != 1:
    refuse(directory, f"{len(models)} model .npz files ({models[:3]}); "
            "a Marian release directory holds one")
  vocabularies = sorted(glob.glob(os.path.join(directory, "*.vocab.yml")))
  if len(vocabularies) != 1:
    refuse(directory, f"{len(vocabularies)} *.vocab.yml files; one joint "
            "vocabulary is imported (as OPUS-MT ships)")
  return models[0], vocabularies[0]


def model_config(yml, path):
  """The `ModelConfig` fields of Marian's model.yml.

  Args:
    yml: model.yml's dict (strings).
    path: where it came from, for errors.
  Returns:
    (fields, notes).
  Raises:
    ValueError naming the option this model cannot represent exactly.
  """
  def need(name, want, default):
    value = str(yml.get(name, default))
    if value != want:
      refuse(path, f"{name}: {value!r}; this model needs {want!r}")
  need("type", "transformer", "")
  need("transformer-decoder-autoreg", "self-attention", "self-attention")
  need("transformer-no-projection", "false", "false")
  need("transformer-train-positions", "false", "false")
  need("right-left", "false", "false")
  need("transformer-ffn-depth", "2", "2")
  if str(yml.get("transformer-decoder-ffn-depth", "0")) not in ("0", "2"):
    need("transformer-decoder-ffn-depth", "2", "2")
  if yml.get("transformer-tied-layers"):
    refuse(path, "transformer-tied-layers: layers shared within a stack "
            "are not imported")
  if int(yml.get("lemma-dim-emb", 0) or 0) or int(
      yml.get("factors-dim-emb", 0) or 0):
    refuse(path, "factored vocabularies (lemma-dim-emb, factors-dim-emb) "
            "are not imported")
  norms = (yml.get("transformer-preprocess", ""),
           yml.get("transformer-postprocess", "dan"),
           yml.get("transformer-postprocess-top", ""))
  norm_position = {("", "dan", ""): "post", ("n", "da", "n"): "pre"}.get(
      norms)
  if norm_position is None:
    refuse(path, "transformer-preprocess/-postprocess/-postprocess-top: "
            f"{norms}; post-norm ('', 'dan', '') and pre-norm ('n', 'da', "
            "'n') are imported")
  if "n" in yml.get("transformer-postprocess-emb", "d"):
    refuse(path, "transformer-postprocess-emb: a layer norm on the "
            "embeddings is not imported")
  activation = ACTIVATIONS.get(yml.get("transformer-ffn-activation"))
  if activation is None:
    refuse(path, "transformer-ffn-activation: "
            f"{yml.get('transformer-ffn-activation')!r}; relu or swish "
            "(Marian's gelu is x*sigmoid(1.702x), not the exact one here)")
  d_ff = int(yml["transformer-dim-ffn"])
  decoder_d_ff = int(yml.get("transformer-decoder-dim-ffn", 0) or 0)
  if decoder_d_ff not in (0, d_ff):
    refuse(path, f"transformer-decoder-dim-ffn: {decoder_d_ff} and "
            f"transformer-dim-ffn: {d_ff}; one d_ff here")
  sizes = set(yml.get("dim-vocabs", []))
  if len(sizes) != 1:
    refuse(path, f"dim-vocabs: {yml.get('dim-vocabs')}; one joint "
            "vocabulary here")
  fields = dict(
      vocab_size=int(sizes.pop()) + 1,  # and <pad>
      num_layers=int(yml["enc-depth"]),
      num_encoder_layers=int(yml["enc-depth"]),
      num_decoder_layers=int(yml["dec-depth"]), d_model=int(yml["dim-emb"]),
      d_ff=d_ff, num_heads=int(yml["transformer-heads"]),
      positional_encoding="sinusoidal_halves",
      max_length=max(512, int(yml.get("max-length", 0) or 0)),
      norm_position=norm_position, layer_norm_epsilon=LAYER_NORM_EPSILON,
      activation=activation, decoder_start="zero", output_bias=True,
      dropout_rate=float(yml.get("transformer-dropout", 0.1) or 0),
      attention_dropout_rate=float(
          yml.get("transformer-dropout-attention", 0) or 0))
  notes = []
  if float(yml.get("transformer-dropout-ffn", 0) or 0):
    notes.append("transformer-dropout-ffn is not applied when this model is "
                 "fine-tuned (no such dropout here)")
  if yml.get("guided-alignment", "none") != "none":
    notes.append("trained with guided alignment: a training loss only, the "
                 "weights and translations are the same; fine-tuning here "
                 "does not use it")
  return fields, tuple(notes)


def read_vocabulary(path):
  """Marian's *.vocab.yml (piece: id) as pieces by id."""
  with open(path, "rb") as f:
    data = f.read()
  vocab = _yaml(data, path)
  if not isinstance(vocab, dict):
    refuse(path, "not a Marian vocabulary (piece: id lines)")
  try:
    by_id = {int(i): piece for piece, i in vocab.items()}
  except (TypeError, ValueError):
    refuse(path, "an id that is not an integer")
  if sorted(by_id) != list(range(len(vocab))):
    refuse(path, f"its ids are not 0..{len(vocab) - 1}, each once")
  pieces = [by_id[i] for i in range(len(vocab))]
  for piece in ("</s>", "<unk>"):
    if piece not in vocab:
      refuse(path, f"no {piece} piece")
  if "<pad>" in vocab:
    refuse(path, "a <pad> piece already: not a Marian vocabulary")
  return pieces


def vocab_json(pieces):
  """vocab.json's bytes (Transformers' layout) for Marian's pieces, <pad>
  last: what `MarianVocabulary` reads."""
  vocab = {piece: i for i, piece in enumerate(pieces)}
  vocab["<pad>"] = len(pieces)
  return json.dumps(vocab, ensure_ascii=False).encode("utf-8")


def read_model(path):
  """({name: float32 array}, model.yml's dict) of a Marian .npz."""
  try:
    with np.load(path) as npz:
      arrays = {name: npz[name] for name in npz.files}
  except Exception as e:  # pylint: disable=broad-except
    refuse(path, f"unreadable .npz ({e})")
  if MODEL_YML not in arrays:
    refuse(path, f"no {MODEL_YML!r}: not a Marian model")
  yml = _yaml(arrays.pop(MODEL_YML).tobytes().rstrip(b"\0"),
              f"{path}:{MODEL_YML}")
  return {k: np.asarray(v, np.float32) for k, v in arrays.items()}, yml


def _vector(weights, name, size):
  return weights.get(name, (1, size))[0]


def _assign_norm(weights, scope, norm, suffix):
  d = norm.gamma.shape[0]
  assign(norm.gamma, _vector(weights, f"{scope}_ln_scale{suffix}", d))
  assign(norm.beta, _vector(weights, f"{scope}_ln_bias{suffix}", d))


def _assign_affine(weights, scope, suffix, affine):
  assign(affine.kernel, weights.get(f"{scope}_W{suffix}",
                                     affine.kernel.shape))
  assign(affine.bias, _vector(weights, f"{scope}_b{suffix}",
                               affine.bias.shape[0]))


def _assign_layer(weights, scope, layer, suffix):
  """One `named_weights.Layer` from Marian layer `scope`'s tensors (`suffix`
  "_pre" on pre-norm layer norms)."""
  attentions = ((f"{scope}_self", layer.self_attention,
                 layer.self_attention_norm),
                (f"{scope}_context", layer.cross_attention,
                 layer.cross_attention_norm))
  for prefix, attention, norm in attentions:
    if attention is None:
      continue
    for ours, theirs in (("query", "q"), ("key", "k"), ("value", "v"),
                         ("output", "o")):
      _assign_affine(weights, prefix, theirs, getattr(attention, ours))
    _assign_norm(weights, f"{prefix}_Wo", norm, suffix)
  _assign_affine(weights, f"{scope}_ffn", "1", layer.feed_forward.inner)
  _assign_affine(weights, f"{scope}_ffn", "2", layer.feed_forward.outer)
  _assign_norm(weights, f"{scope}_ffn_ffn", layer.feed_forward_norm, suffix)


def _embeddings(weights, vocab_size, d_model):
  """(source, target, output) of Marian's `Wemb` / `encoder_Wemb`,
  `decoder_Wemb` and `decoder_ff_logit_out_W` (or tied), each with a zero
  <pad> row appended."""
  shape = (vocab_size, d_model)
  if "Wemb" in weights.tensors:
    source = target = weights.get("Wemb", shape)
  else:
    source = weights.get("encoder_Wemb", shape)
    target = weights.get("decoder_Wemb", shape)
  if "decoder_ff_logit_out_W" in weights.tensors:
    output = weights.get("decoder_ff_logit_out_W", shape[::-1]).T
  else:
    output = target
  pad = np.zeros([1, d_model], np.float32)
  return tuple(np.concatenate([m, pad]) for m in (source, target, output)), (
      source is target and output is target)


def from_marian(directory, dtype=None):
  """A Marian release directory as a built `Transformer`.

  Args:
    directory: holds one model .npz and one *.vocab.yml (source.spm and
      target.spm are read by `MarianVocabulary`).
    dtype: a Keras dtype policy; None: the global one.
  Returns:
    (`Imported` (`interop/common.py`), vocab.json's bytes: the joint
    vocabulary as `MarianVocabulary` keeps it).
  Raises:
    ValueError naming the file and the option or tensor it cannot import.
  """
  from tf_transformer.model import build_model  # pylint: disable=g-import-not-at-top
  model_path, vocab_path = find_files(directory)
  tensors, yml = read_model(model_path)
  fields, notes = model_config(yml, f"{model_path}:{MODEL_YML}")
  pieces = read_vocabulary(vocab_path)
  if len(pieces) + 1 != fields["vocab_size"]:
    refuse(vocab_path, f"{len(pieces)} pieces, but model.yml's dim-vocabs "
            f"is {fields['vocab_size'] - 1}")
  order = vocabulary_order(len(pieces) + 1, len(pieces),
                           pieces.index("<unk>"), pieces.index("</s>"))
  weights = Weights(tensors, model_path)
  (source, target, output), shared = _embeddings(
      weights, len(pieces), fields["d_model"])
  if not shared:
    fields["share_embeddings"] = False
    if np.array_equal(output, target):
      notes += ("the decoder's embeddings and output projection are one "
                "matrix in Marian (tied-embeddings), two equal ones here: "
                "fine-tuning updates them apart",)
  model = build_model(TransformerConfig.from_flat(fields), dtype)
  named = model.named_weights()
  assign(named.source_embedding, source[order])
  if not shared:
    assign(named.target_embedding, target[order])
    assign(named.output_embedding, output[order])
  if "decoder_ff_logit_out_b" in tensors:
    bias = _vector(weights, "decoder_ff_logit_out_b", len(pieces))
  else:
    bias = np.zeros([len(pieces)], np.float32)
  assign(named.output_bias, np.append(bias, PAD_LOGIT)[order])
  suffix = "_pre" if fields["norm_position"] == "pre" else ""
  for stack, scope in ((named.encoder, "encoder"), (named.decoder, "decoder")):
    for i, layer in enumerate(stack.layers):
      _assign_layer(weights, f"{scope}_l{i + 1}", layer, suffix)
    if stack.final_norm is not None:
      _assign_norm(weights, f"{scope}_top", stack.final_norm, "")
  unused = sorted(set(tensors) - weights.used)
  if unused:
    refuse(model_path, f"tensors this model has no place for: "
            f"{unused[:5]}{' ...' if len(unused) > 5 else ''}")
  return Imported(model, order, notes), vocab_json(pieces)
