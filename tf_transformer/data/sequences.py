"""Text to the id sequences the model reads, defined once for training,
evaluation, translation and the export (section 3.1: the encoder reads the
source, the decoder its output shifted right).

- `source_ids`: subwords of the text, cut to `max_tokens` if given, then EOS
  (unless the model reads its source without, `ModelConfig.source_eos`);
- `labels`: the target's subwords then EOS (what the decoder predicts);
- `decoder_input`: BOS then the labels without their last token (the
  labels shifted right by one position).

Each takes one sequence (a string, or 1-D ids) or a batch ([batch] strings,
or [batch, length] ids, ragged or padded) and keeps that form. Training
drops pairs longer than its `max_length` instead of cutting them, so only
translation and the export pass `max_tokens`.
"""

import tensorflow as tf

from tf_transformer.special_ids import BOS_ID, EOS_ID


def subwords(tokenizer, text):
  """`tokenizer.tokenize` (a `Vocabulary` or a tensorflow-text
  SentencepieceTokenizer) of `text`, invalid UTF-8 bytes read as U+FFFD."""
  return tokenizer.tokenize(tf.strings.unicode_transcode(
      text, "UTF-8", "UTF-8", errors="replace"))


def target_side(tokenizer):
  """What cuts target text: `tokenizer.target` where the languages have
  their own SentencePiece models (an imported Marian model's), else
  `tokenizer`."""
  return getattr(tokenizer, "target", None) or tokenizer


def source_ids(tokenizer, text, max_tokens=None, eos=True):
  """The encoder's input: subwords (cut to `max_tokens`) then EOS, or no
  EOS where `eos` is False (`ModelConfig.source_eos`)."""
  ids = subwords(tokenizer, text)
  if max_tokens is not None:
    ids = ids[..., :max_tokens]
  return _append(ids, EOS_ID) if eos else ids


def labels(target_ids):
  """The decoder's targets: the target's subwords then EOS."""
  return _append(target_ids, EOS_ID)


def decoder_input(label_ids):
  """BOS then `label_ids` without the last token: position i of the
  decoder reads label i - 1. (On padded rows a short row's EOS enters the
  input at the position whose label is padding, which no loss reads.)"""
  return _prepend(label_ids[..., :-1], BOS_ID)


def _column(ids, id_):
  """[id_] for one sequence, or a [rows, 1] column of it for a batch."""
  if ids.shape.rank == 1:
    return tf.constant([id_], ids.dtype)
  rows = ids.nrows() if isinstance(ids, tf.RaggedTensor) else tf.shape(ids)[0]
  return tf.fill(tf.stack([tf.cast(rows, tf.int32), 1]),
                 tf.constant(id_, ids.dtype))


def _append(ids, id_):
  return tf.concat([ids, _column(ids, id_)], axis=ids.shape.rank - 1)


def _prepend(ids, id_):
  return tf.concat([_column(ids, id_), ids], axis=ids.shape.rank - 1)
