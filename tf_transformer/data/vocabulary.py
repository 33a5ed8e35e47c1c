"""The shared source-target subword vocabulary (section 5.1).

Trained with the `sentencepiece` library (BPE by default, as the paper's
byte-pair encoding; `unigram` is offered too), with the fixed ids of
`special_ids` and byte fallback, so any UTF-8 text, even characters never
seen in training, tokenizes without <unk> and detokenizes back. Tokenization
and detokenization run in the TensorFlow graph through tensorflow-text's
`SentencepieceTokenizer`: the same object goes into the exported SavedModel.
The model file (`vocabulary.model`) is stored with the model.
"""

import hashlib
import io
import os
import re
from typing import Iterable

import sentencepiece as spm
import tensorflow as tf
import tensorflow_text as tf_text

from tf_transformer import special_ids
from tf_transformer.data import errors
from tf_transformer.data import marian_vocabulary
from tf_transformer.data.errors import DataError

FILENAME = "vocabulary.model"


def train(sentences: Iterable[str], vocab_size: int, model_type: str = "bpe",
          max_sentences: int = 5_000_000, seed: int = 0) -> bytes:
  """Trains a SentencePiece model on `sentences` (both languages) and returns
  its serialized proto. When the text is too small for `vocab_size`, the
  vocabulary is smaller (check `Vocabulary.vocab_size`)."""
  if model_type not in ("bpe", "unigram"):
    raise DataError(f"--vocab_model_type={model_type}: expected bpe or unigram")
  model = io.BytesIO()
  spm.set_random_generator_seed(seed)
  try:
    with errors.unwrapped():  # a reader's DataError, not SentencePiece's
      spm.SentencePieceTrainer.train(
          sentence_iterator=iter(sentences), model_writer=model,
          vocab_size=vocab_size, model_type=model_type,
          pad_id=special_ids.PAD_ID, unk_id=special_ids.UNK_ID,
          bos_id=special_ids.BOS_ID, eos_id=special_ids.EOS_ID,
          byte_fallback=True, character_coverage=0.9999,
          hard_vocab_limit=False, input_sentence_size=max_sentences,
          shuffle_input_sentence=True, num_threads=os.cpu_count() or 1,
          max_sentence_length=16384, minloglevel=2)
  except RuntimeError as e:
    needed = re.search(r"smaller than required_chars\. \d+ vs (\d+)", str(e))
    if needed:  # not SentencePiece's advice, which names its own flags
      raise DataError(
          f"--vocab_size={vocab_size} is too small for this corpus: it needs "
          f"at least {needed.group(1)} pieces (the 4 special ids, 256 byte "
          "pieces and every distinct character of the training text); pass "
          f"--vocab_size={needed.group(1)} or more, or leave it out to follow "
          "the corpus") from None
    raise DataError(f"SentencePiece training failed: {e}") from None
  return model.getvalue()


def sha256(vocabulary) -> str:
  """What identifies a vocabulary (a `Vocabulary` or a `MarianVocabulary`)
  in the files made with it: token arrays, shortlist tables."""
  return hashlib.sha256(vocabulary.model_proto).hexdigest()


class Vocabulary:
  """A trained SentencePiece model, run in the graph by tensorflow-text.

  The tokenizer op is made anew for each use (`make_tokenizer`): an eager
  SentencePiece resource dies when anything calls `tf.random.set_seed`
  (which Keras' `set_random_seed` does), tensorflow/text issue 570. Inside a
  tf.function, tf.data map or SavedModel the op is part of the graph.
  """

  def __init__(self, model_proto: bytes):
    self.model_proto = model_proto
    self.vocab_size = int(self.make_tokenizer().vocab_size())

  def make_tokenizer(self) -> tf_text.SentencepieceTokenizer:
    return tf_text.SentencepieceTokenizer(model=self.model_proto)

  @staticmethod
  def saved_in(directory: str) -> bool:
    """Whether `directory` holds a vocabulary `load` reads."""
    return tf.io.gfile.exists(os.path.join(directory, FILENAME)) or (
        marian_vocabulary.is_marian(directory))

  @classmethod
  def load(cls, path: str) -> "Vocabulary":
    """From a `.model` file, or a directory holding `vocabulary.model`; an
    imported Marian model's directory gives its `MarianVocabulary`."""
    if tf.io.gfile.isdir(path):
      if marian_vocabulary.is_marian(path):
        return marian_vocabulary.MarianVocabulary.load(path)
      path = os.path.join(path, FILENAME)
    if not tf.io.gfile.exists(path):
      raise DataError(f"{path}: no SentencePiece vocabulary; build one with "
                      "bin/prepare_data.py")
    with tf.io.gfile.GFile(path, "rb") as f:
      return cls(f.read())

  def save(self, directory: str) -> str:
    tf.io.gfile.makedirs(directory)
    path = os.path.join(directory, FILENAME)
    with tf.io.gfile.GFile(path, "wb") as f:
      f.write(self.model_proto)
    return path

  def processor(self, side="source") -> spm.SentencePieceProcessor:
    """The same model in SentencePiece's own library, for tokenizing a
    corpus outside the graph on many threads (`token_store`); one model
    cuts both sides."""
    del side
    return spm.SentencePieceProcessor(model_proto=self.model_proto)

  def tokenize(self, text):
    """str or [batch] strings -> int32 ids (ragged for a batch), no BOS/EOS."""
    return self.make_tokenizer().tokenize(text)

  def detokenize(self, ids):
    """Ids -> text, the inverse of `tokenize`; PAD, BOS and EOS are control
    pieces that SentencePiece decodes to nothing."""
    return self.make_tokenizer().detokenize(ids)

  def pieces(self, ids):
    """The subword strings of `ids`, for inspection."""
    return self.make_tokenizer().id_to_string(ids)
