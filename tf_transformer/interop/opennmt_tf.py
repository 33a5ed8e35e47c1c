"""An OpenNMT-tf 2.x Transformer (Klein et al., 2017) as this project's
`Transformer`, read from its V2 checkpoint with TensorFlow alone (no
OpenNMT-tf), its vocabulary file and the SentencePiece model its pieces
came from.

    imported, vocab_json, said = opennmt_tf.from_opennmt(
        "run/", ("vocab.txt", "vocab.txt"),
        opennmt_tf.model_type("TransformerBase"))

OpenNMT-tf's semantics, each a `ModelConfig` option: pre-norm with a final
norm on each stack (or post-norm), layer normalization with Keras' epsilon
1e-3, [sin | cos] sinusoids with tensor2tensor's frequencies and positions
from 1 ("sinusoidal_opennmt"), embeddings scaled by sqrt(d_model), ReLU or
GELU in its tanh form, one, two or three embedding matrices, a bias on the
logits, no EOS at the source's end unless trained with one (`source_eos`),
and the decoder started from <s>. The checkpoint holds the sizes; the head
count and the activation come from the model type (`CATALOG`, or given for
a custom model). Ids are the vocabulary file's lines (<blank>, <s>, </s>,
then the pieces) and the out-of-vocabulary row last, reordered so that
<blank>, the OOV row, <s> and </s> take PAD, UNK, BOS and EOS
(`vocabulary_order`). What this model cannot hold is refused in one line
naming the option; nothing is approximated.
"""

import json
import os
import typing

import tensorflow as tf

from tf_transformer.config import TransformerConfig
from tf_transformer.data.marian_vocabulary import vocabulary_order
from tf_transformer.interop.common import Imported, assign, refuse


class ModelType(typing.NamedTuple):
  """What an OpenNMT-tf model type fixes that its checkpoint does not
  show."""
  num_heads: int
  activation: str = "relu"
  source_eos: bool = False  # the type's `source_sequence_controls`
  unsupported: str = ""  # why it cannot be imported, if it cannot


_RELATIVE = ("relative positions (maximum_relative_position) are not "
             "built here")
# OpenNMT-tf 2.32's catalog (opennmt/models/catalog.py) of Transformers.
CATALOG = {
    "Transformer": ModelType(8),
    "TransformerBase": ModelType(8),
    "TransformerBaseSharedEmbeddings": ModelType(8),
    "TransformerBig": ModelType(16),
    "TransformerBigSharedEmbeddings": ModelType(16),
    "TransformerTiny": ModelType(2),
    "ScalingNmtEnDe": ModelType(16, source_eos=True),
    "ScalingNmtEnFr": ModelType(16, source_eos=True),
    "TransformerBaseRelative": ModelType(8, unsupported=_RELATIVE),
    "TransformerBigRelative": ModelType(16, unsupported=_RELATIVE),
}
CUSTOM = "custom"
# OpenNMT-tf's feed-forward activations: tf.nn.relu and opennmt.layers.gelu.
ACTIVATIONS = {"relu": "relu", "gelu_tanh": "gelu_tanh"}
SPECIALS = ("<blank>", "<s>", "</s>")  # opennmt/constants.py, ids 0, 1, 2
LAYER_NORM_EPSILON = 1e-3  # tf.keras.layers.LayerNormalization's
_VALUE = "/.ATTRIBUTES/VARIABLE_VALUE"


def model_type(name, num_heads=None, activation=None):
  """The `ModelType` of an OpenNMT-tf catalog name, or of a custom model
  with `num_heads` and `activation` given.

  Raises:
    ValueError naming the flag.
  """
  if name == CUSTOM:
    if num_heads is None or activation is None:
      raise ValueError(f"--opennmt_model={CUSTOM} needs --num_heads and "
                       "--activation (the checkpoint does not hold them)")
    if activation not in ACTIVATIONS:
      raise ValueError(f"--activation={activation}: one of "
                       f"{sorted(ACTIVATIONS)}")
    return ModelType(num_heads, activation)
  if name not in CATALOG:
    raise ValueError(f"--opennmt_model={name}: one of {sorted(CATALOG)}, "
                     f"or {CUSTOM} with --num_heads and --activation")
  if num_heads is not None or activation is not None:
    raise ValueError(f"--num_heads and --activation are for "
                     f"--opennmt_model={CUSTOM}; {name} fixes them")
  if CATALOG[name].unsupported:
    raise ValueError(f"--opennmt_model={name}: {CATALOG[name].unsupported}")
  return CATALOG[name]


# OpenNMT Tokenizer (pyonmttok) options that only sample pieces in
# training: the SentencePiece model cuts the same pieces at inference.
_SAMPLING = ("sp_nbest_size", "sp_alpha", "nbest_size", "alpha")


def tokenization_model(path):
  """The SentencePiece model of an OpenNMT-tf tokenization config (the
  YAML file its data config names as `source_tokenization`).

  Args:
    path: the YAML file: `type: SentencePieceTokenizer` with `params:
      model`, or `type: OpenNMTTokenizer` (or no type) with `mode: none`
      and `sp_model_path`, options that cut what SentencePiece alone cuts.
  Returns:
    The SentencePiece model's path (relative ones read from the file's
    folder).
  Raises:
    ValueError naming the file and the option SentencePiece alone does not
    reproduce.
  """
  import yaml  # pylint: disable=g-import-not-at-top
  try:
    with tf.io.gfile.GFile(path) as f:
      config = yaml.safe_load(f)
  except tf.errors.NotFoundError:
    refuse(path, "no such tokenization config")
  except yaml.YAMLError as e:
    refuse(path, f"not YAML ({str(e).splitlines()[0]})")
  if not isinstance(config, dict):
    refuse(path, "not a tokenization config (a YAML mapping)")
  kind = config.get("type", "OpenNMTTokenizer")
  params = dict(config.get("params", {}) if "type" in config else config)
  if kind == "SentencePieceTokenizer":
    model = params.pop("model", None)
  elif kind == "OpenNMTTokenizer":
    mode = params.pop("mode", "conservative")
    if mode != "none":
      refuse(path, f"mode: {mode}: the OpenNMT Tokenizer's own "
             "segmentation; only mode: none with sp_model_path "
             "(SentencePiece alone) is carried into the graph")
    model = params.pop("sp_model_path", None)
  else:
    refuse(path, f"type: {kind}: only SentencePiece's tokenization "
           "(SentencePieceTokenizer, or OpenNMTTokenizer with "
           "sp_model_path) is carried into the graph")
  other = sorted(set(params) - set(_SAMPLING))
  if other:
    refuse(path, f"{other[0]}: an OpenNMT Tokenizer option that "
           "SentencePiece alone does not reproduce")
  if not model:
    refuse(path, "names no SentencePiece model (model or sp_model_path)")
  return os.path.join(os.path.dirname(path), model)


def find_checkpoint(path):
  """(checkpoint prefix, whether it is OpenNMT-tf's average) of `path`: a
  run directory (its `avg/` average where it has one, else its latest
  checkpoint) or a checkpoint prefix."""
  if tf.io.gfile.exists(path + ".index"):
    return path, False
  averaged = tf.train.latest_checkpoint(os.path.join(path, "avg"))
  if averaged:
    return averaged, True
  latest = tf.train.latest_checkpoint(path)
  if not latest:
    refuse(path, "no OpenNMT-tf checkpoint (no `checkpoint` file naming one"
           ", no avg/ average)")
  return latest, False


def is_checkpoint(path):
  """Whether `path` is an OpenNMT-tf run directory or checkpoint prefix."""
  return (tf.io.gfile.exists(path + ".index")
          or tf.io.gfile.exists(os.path.join(path, "checkpoint")))


def read_vocabulary(path):
  """An OpenNMT vocabulary file's tokens, one a line (<blank>, <s>, </s>
  first), as OpenNMT-tf numbers them."""
  try:
    with tf.io.gfile.GFile(path, "rb") as f:
      tokens = [line.decode("utf-8").rstrip("\r\n")
                for line in f.read().split(b"\n")]
  except UnicodeDecodeError as e:
    refuse(path, f"not UTF-8 ({e})")
  except tf.errors.NotFoundError:
    refuse(path, "no such vocabulary file")
  if tokens and not tokens[-1]:
    tokens.pop()
  if tuple(tokens[:3]) != SPECIALS:
    refuse(path, f"lines 1-3 are {tokens[:3]}: an OpenNMT-tf vocabulary "
           f"starts with {list(SPECIALS)}, which its ids 0-2 mean")
  seen = {}
  for line, token in enumerate(tokens, 1):
    if token in seen:
      refuse(path, f"line {line} repeats {token!r} of line {seen[token]}")
    seen[token] = line
  for reserved in ("<pad>", "<unk>"):
    if reserved in seen:
      refuse(path, f"line {seen[reserved]}: {reserved!r}, which the "
             "imported vocabulary keeps for "
             f"{'<blank>' if reserved == '<pad>' else 'the OOV row'}")
  return tokens


def vocab_json(tokens):
  """The joint vocabulary as `MarianVocabulary` keeps it: {piece: id},
  <blank> as <pad>, the out-of-vocabulary row as <unk>."""
  vocab = {("<pad>" if t == "<blank>" else t): i
           for i, t in enumerate(tokens)}
  vocab["<unk>"] = len(tokens)
  return json.dumps(vocab, ensure_ascii=False, indent=0).encode("utf-8")


class Checkpoint:
  """The model's variables of an OpenNMT-tf checkpoint by their names
  under "model/", each taken once, checked for shape."""

  def __init__(self, prefix):
    self.prefix = prefix
    try:
      self.reader = tf.train.load_checkpoint(prefix)
    except (tf.errors.OpError, ValueError) as e:
      refuse(prefix, f"unreadable checkpoint ({str(e).splitlines()[0]})")
    self.shapes = {name[len("model/"):-len(_VALUE)]: shape
                   for name, shape in
                   self.reader.get_variable_to_shape_map().items()
                   if name.startswith("model/") and name.endswith(_VALUE)
                   and "/.OPTIMIZER_SLOT/" not in name}
    self.used = set()

  def __contains__(self, name):
    return name in self.shapes

  def get(self, name, shape=None):
    if name not in self.shapes:
      refuse(self.prefix, f"no variable model/{name}")
    if shape is not None and tuple(self.shapes[name]) != tuple(shape):
      refuse(self.prefix, f"model/{name} has shape {self.shapes[name]}, "
             f"the model makes it {tuple(shape)}")
    self.used.add(name)
    return self.reader.get_tensor(f"model/{name}{_VALUE}")


def _count_layers(checkpoint, stack):
  indices = {int(name.split("/")[2]) for name in checkpoint.shapes
             if name.startswith(f"{stack}/layers/")}
  if indices != set(range(len(indices))) or not indices:
    refuse(checkpoint.prefix, f"{stack} layers {sorted(indices)}: expected "
           "0..N-1 (a self-attention Transformer)")
  return len(indices)


def model_config(checkpoint, kind, vocab_size, source_eos):
  """The `ModelConfig` fields of the checkpoint's model.

  Args:
    checkpoint: a `Checkpoint`.
    kind: its `ModelType`.
    vocab_size: the vocabulary file's tokens + the OOV row.
    source_eos: whether the model read its source with EOS.
  Returns:
    (fields, notes).
  """
  for name in checkpoint.shapes:
    if "relative_position" in name:
      refuse(checkpoint.prefix, f"model/{name}: {_RELATIVE}")
    if "position_encoder" in name:
      refuse(checkpoint.prefix, f"model/{name}: a learned position "
             "embedder (PositionEmbedder); only sinusoids are imported")
  if "encoder/layers/0/self_attention/layer/linear_queries/kernel" not in (
      checkpoint):
    refuse(checkpoint.prefix, "no model/encoder/layers/0/self_attention: "
           "not an OpenNMT-tf Transformer (SelfAttentionEncoder)")
  num_layers = _count_layers(checkpoint, "encoder")
  embedding = "examples_inputter/features_inputter/embedding"
  rows, d_model = checkpoint.shapes.get(embedding, (None, None))
  if rows is None:
    refuse(checkpoint.prefix, f"no model/{embedding}: a word embedder "
           "(WordEmbedder) source is imported")
  if rows != vocab_size:
    refuse(checkpoint.prefix, f"{rows} source embeddings, but the "
           f"vocabulary has {vocab_size - 1} tokens + the OOV row")
  if d_model % kind.num_heads:
    refuse(checkpoint.prefix, f"num_heads={kind.num_heads} does not divide "
           f"d_model={d_model}")
  pre_norm = "encoder/layer_norm/gamma" in checkpoint
  d_ff = checkpoint.shapes["encoder/layers/0/ffn/layer/inner/kernel"][1]
  shared = not any(name in checkpoint for name in (
      "examples_inputter/labels_inputter/embedding",
      "decoder/output_layer/kernel"))
  fields = dict(
      vocab_size=vocab_size, num_layers=num_layers,
      num_encoder_layers=num_layers,
      num_decoder_layers=_count_layers(checkpoint, "decoder"), d_model=d_model,
      d_ff=d_ff, num_heads=kind.num_heads,
      positional_encoding="sinusoidal_opennmt", share_embeddings=shared,
      norm_position="pre" if pre_norm else "post",
      layer_norm_epsilon=LAYER_NORM_EPSILON, activation=kind.activation,
      decoder_start="bos",
      output_bias="decoder/output_layer/bias" in checkpoint,
      source_eos=source_eos, dropout_rate=0.1, attention_dropout_rate=0.1)
  notes = ("OpenNMT-tf's dropout inside the feed-forward (ffn_dropout) is "
           "not applied when this model is fine-tuned",)
  return fields, notes


def _embeddings(checkpoint, vocab_size, d_model):
  """(source, target, output) matrices in OpenNMT-tf's order, and notes."""
  shape = (vocab_size, d_model)
  source = checkpoint.get("examples_inputter/features_inputter/embedding",
                          shape)
  target = source
  if "examples_inputter/labels_inputter/embedding" in checkpoint:
    target = checkpoint.get("examples_inputter/labels_inputter/embedding",
                            shape)
  output = target
  if "decoder/output_layer/kernel" in checkpoint:
    output = checkpoint.get("decoder/output_layer/kernel", shape[::-1]).T
  tied = [pair for pair, (a, b) in {
      "the source and target embeddings": (source, target),
      "the target embeddings and output projection": (target, output)}.items()
          if a is b]
  shared = len(tied) == 2
  notes = () if shared or not tied else tuple(
      f"{pair} are one matrix in the OpenNMT-tf model, two equal ones "
      "here: fine-tuning updates them apart" for pair in tied)
  return (source, target, output), notes


def _norm(checkpoint, name, norm):
  assign(norm.gamma, checkpoint.get(f"{name}/gamma", norm.gamma.shape))
  assign(norm.beta, checkpoint.get(f"{name}/beta", norm.beta.shape))


def _dense(checkpoint, name, affine):
  assign(affine.kernel, checkpoint.get(f"{name}/kernel", affine.kernel.shape))
  assign(affine.bias, checkpoint.get(f"{name}/bias", affine.bias.shape))


def _sublayer(checkpoint, name, norm, pre_norm):
  """The normalization of `name`'s residual block: its input's (pre-norm)
  or its output's."""
  _norm(checkpoint, f"{name}/{'input' if pre_norm else 'output'}_layer_norm",
        norm)


def _attention(checkpoint, name, attention):
  for ours, theirs in (("query", "queries"), ("key", "keys"),
                       ("value", "values"), ("output", "output")):
    _dense(checkpoint, f"{name}/layer/linear_{theirs}",
           getattr(attention, ours))


def _layer(checkpoint, prefix, layer, pre_norm):
  """One `named_weights.Layer` from an OpenNMT-tf layer's variables."""
  _attention(checkpoint, f"{prefix}/self_attention", layer.self_attention)
  _sublayer(checkpoint, f"{prefix}/self_attention",
            layer.self_attention_norm, pre_norm)
  if layer.cross_attention is not None:
    _attention(checkpoint, f"{prefix}/attention/0", layer.cross_attention)
    _sublayer(checkpoint, f"{prefix}/attention/0",
              layer.cross_attention_norm, pre_norm)
  _dense(checkpoint, f"{prefix}/ffn/layer/inner", layer.feed_forward.inner)
  _dense(checkpoint, f"{prefix}/ffn/layer/outer", layer.feed_forward.outer)
  _sublayer(checkpoint, f"{prefix}/ffn", layer.feed_forward_norm, pre_norm)


def from_opennmt(path, vocabularies, kind, source_eos=None,
                 dtype=None):
  """An OpenNMT-tf Transformer's checkpoint as a built `Transformer`.

  Args:
    path: its run directory (the averaged checkpoint in avg/ where there is
      one, else the latest) or a checkpoint prefix.
    vocabularies: the source and target vocabulary files (one joint
      vocabulary: equal files, or one path twice).
    kind: its `ModelType` (`model_type`).
    source_eos: whether it was trained with EOS at the source's end
      (OpenNMT-tf's `source_sequence_controls`); None: the type's default.
    dtype: a Keras dtype policy; None: the global one.
  Returns:
    (`Imported`, vocab.json's bytes, a line naming the checkpoint read).
  Raises:
    ValueError naming the file and the option or variable it cannot import.
  """
  from tf_transformer.model import build_model  # pylint: disable=g-import-not-at-top
  tokens = [read_vocabulary(p) for p in vocabularies]
  if tokens[0] != tokens[-1]:
    refuse(vocabularies[-1], f"differs from {vocabularies[0]}: one joint "
           "vocabulary for source and target here")
  tokens = tokens[0]
  prefix, averaged = find_checkpoint(path)
  checkpoint = Checkpoint(prefix)
  vocab_size = len(tokens) + 1
  fields, notes = model_config(
      checkpoint, kind, vocab_size,
      kind.source_eos if source_eos is None else source_eos)
  (source, target, output), more_notes = _embeddings(
      checkpoint, vocab_size, fields["d_model"])
  order = vocabulary_order(vocab_size, 0, len(tokens), 2)
  model = build_model(TransformerConfig.from_flat(fields), dtype)
  named = model.named_weights()
  assign(named.source_embedding, source[order])
  if not fields["share_embeddings"]:
    assign(named.target_embedding, target[order])
    assign(named.output_embedding, output[order])
  if fields["output_bias"]:
    assign(named.output_bias,
           checkpoint.get("decoder/output_layer/bias", (vocab_size,))[order])
  pre_norm = fields["norm_position"] == "pre"
  for stack, name in ((named.encoder, "encoder"), (named.decoder, "decoder")):
    for i, layer in enumerate(stack.layers):
      _layer(checkpoint, f"{name}/layers/{i}", layer, pre_norm)
    if pre_norm:
      _norm(checkpoint, f"{name}/layer_norm", stack.final_norm)
  unused = sorted(set(checkpoint.shapes) - checkpoint.used)
  if unused:
    refuse(prefix, f"variables this model has no place for: "
           f"{unused[:5]}{' ...' if len(unused) > 5 else ''}")
  said = (f"an OpenNMT-tf checkpoint {prefix}"
          f"{' (the average of the run, avg/)' if averaged else ''}")
  return Imported(model, order, notes + more_notes), vocab_json(tokens), said
