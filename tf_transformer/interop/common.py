"""What the model formats share (`interop/`): the model an importer
returns, refusals that name the file, published tensors taken by name and
shape, and the pieces of our vocabulary that an exporter writes."""

import typing

import numpy as np
import sentencepiece as spm

from tf_transformer.data.marian_vocabulary import MarianVocabulary


class Imported(typing.NamedTuple):
  """An imported model: the `Transformer`, `order` (our id -> the
  published model's id, `vocabulary_order`) and `notes`, lines on what
  differs from the published model in training only."""
  model: typing.Any
  order: np.ndarray
  notes: tuple


def refuse(path, why):
  """Raises ValueError(`path: why`): the one line every importer refuses
  with."""
  raise ValueError(f"{path}: {why}")


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
  """`variable` set to `value` (a NumPy array) as float32."""
  variable.assign(value.astype(np.float32))


def sentencepiece_pieces(model_proto):
  """Every piece of a SentencePiece model, in id order."""
  processor = spm.SentencePieceProcessor(model_proto=model_proto)
  return [processor.id_to_piece(i) for i in range(processor.get_piece_size())]


def vocabulary_pieces(vocabulary):
  """Our ids' pieces: the SentencePiece model's, or an imported Marian
  model's joint vocabulary in our order."""
  if isinstance(vocabulary, MarianVocabulary):
    return list(vocabulary.piece_list)
  return sentencepiece_pieces(vocabulary.model_proto)
