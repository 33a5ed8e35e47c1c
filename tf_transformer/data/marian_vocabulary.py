"""The vocabulary of an imported Marian model (OPUS-MT): a SentencePiece
model for each language and one joint vocabulary of pieces (vocab.json),
as Transformers' `MarianTokenizer` reads them, in the graph with
tensorflow-text and core ops only.

Source text -> source.spm's pieces -> ids of vocab.json (a piece it lacks
is <unk>) in our order (`vocabulary_order`); ids ->
pieces, PAD, UNK and EOS dropped (Transformers' `skip_special_tokens`),
joined with "▁" read as a space, as SentencePiece decodes pieces. The files
are kept as published in the run directory's `marian/` folder.
"""

import hashlib
import json
import os

import numpy as np
import tensorflow as tf
import tensorflow_text as tf_text

from tf_transformer import special_ids
from tf_transformer.data.errors import DataError

FOLDER = "marian"
FILES = ("source.spm", "target.spm", "vocab.json")
_SPACE = "\u2581"  # SentencePiece's word boundary
# A multilingual model's target-language token at the text's start
# (">>fra<< ..."): one piece, not cut by SentencePiece, as Transformers'
# `MarianTokenizer.remove_language_code` takes it (up to the first "<<").
_LANGUAGE_CODE = r"(?s)^(>>.*?<<)(.*)$"


def vocabulary_order(vocab_size, pad, unk, eos):
  """Our id -> the published model's id: its <pad>, <unk> and </s> at
  PAD_ID, UNK_ID and EOS_ID, every other piece in its order in the ids left
  (BOS_ID the first of them: the decoder starts from a zero vector, so id 2
  is an ordinary piece, `ModelConfig.decoder_start`).

  Args:
    vocab_size: the vocabulary's size.
    pad, unk, eos: the published model's ids of those.
  Returns:
    int64 [vocab_size], a permutation.
  """
  if len({pad, unk, eos}) < 3:
    raise ValueError(f"<pad>={pad}, <unk>={unk} and </s>={eos} must differ")
  fixed = {special_ids.PAD_ID: pad, special_ids.UNK_ID: unk,
           special_ids.EOS_ID: eos}
  others = iter(sorted(set(range(vocab_size)) - set(fixed.values())))
  return np.array([fixed[i] if i in fixed else next(others)
                   for i in range(vocab_size)], np.int64)


def read_pieces(data, path):
  """vocab.json's pieces by their published id, and (pad, unk, eos).

  Args:
    data: the file's bytes.
    path: its path, for errors.
  Returns:
    (pieces, (pad, unk, eos)).
  Raises:
    DataError naming the file.
  """
  try:
    vocab = json.loads(data.decode("utf-8"))
  except (ValueError, UnicodeDecodeError) as e:
    raise DataError(f"{path}: not JSON ({e})") from None
  ids = sorted(vocab.values())
  if ids != list(range(len(ids))):
    raise DataError(f"{path}: its ids are not 0..{len(ids) - 1}, each once")
  for piece in ("<pad>", "<unk>", "</s>"):
    if piece not in vocab:
      raise DataError(f"{path}: no {piece} piece")
  pieces = [None] * len(ids)
  for piece, i in vocab.items():
    pieces[i] = piece
  return pieces, (vocab["<pad>"], vocab["<unk>"], vocab["</s>"])


class MarianTokenizer(tf.Module):
  """Text <-> our ids for an imported Marian model, in the graph (what a
  `TranslationModule` asks of a tokenizer: `tokenize`, `detokenize`,
  `id_to_string`), with the source language's SentencePiece model;
  `target` is the same with the target language's (for prefixes and
  scored translations, as Transformers' `text_target`).

  Args:
    spm: the SentencePiece model proto that cuts text into pieces.
    pieces: our ids' pieces.
    target_spm: the target language's proto, or None (this is `target`).
    table: piece -> our id, shared with the other side.
  """

  def __init__(self, spm, pieces, target_spm=None, table=None):
    super().__init__()
    # Distinct names: the op's resource is shared by its node's name, and a
    # loaded SavedModel would otherwise give both sides one model.
    side = "source" if target_spm is not None else "target"
    self.splitter = tf_text.SentencepieceTokenizer(
        model=spm, out_type=tf.string, name=f"{side}_sentencepiece")
    self.piece_strings = tf.constant(pieces)
    self.table = table or tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(
            self.piece_strings, tf.range(len(pieces), dtype=tf.int32)),
        default_value=special_ids.UNK_ID)
    self.target = (None if target_spm is None else
                   MarianTokenizer(target_spm, pieces, table=self.table))

  def tokenize(self, text):
    """str or [batch] strings -> int32 ids (ragged for a batch), no EOS; a
    leading target-language token (">>fra<<") is one piece, the rest is
    cut by SentencePiece."""
    text = tf.convert_to_tensor(text, tf.string)
    batch = tf.reshape(text, [-1])
    has_code = tf.strings.regex_full_match(batch, _LANGUAGE_CODE)
    rest = tf.where(
        has_code, tf.strings.regex_replace(batch, _LANGUAGE_CODE, r"\2"),
        batch)
    ids = tf.ragged.map_flat_values(self.table.lookup,
                                    self.splitter.tokenize(rest))
    codes = tf.boolean_mask(
        tf.strings.regex_replace(batch, _LANGUAGE_CODE, r"\1"), has_code)
    ids = tf.concat([tf.RaggedTensor.from_row_lengths(
        self.table.lookup(codes),
        tf.cast(has_code, ids.row_splits.dtype)), ids], axis=1)
    return ids if text.shape.rank else ids[0]

  def id_to_string(self, ids):
    """The pieces of `ids`."""
    return tf.gather(self.piece_strings, ids)

  def detokenize(self, ids):
    """[batch, length] or ragged ids -> [batch] strings; PAD, UNK and EOS
    dropped."""
    if not isinstance(ids, tf.RaggedTensor):
      ids = tf.RaggedTensor.from_tensor(ids)
    keep = tf.ragged.map_flat_values(
        lambda i: (i != special_ids.PAD_ID) & (i != special_ids.UNK_ID)
        & (i != special_ids.EOS_ID), ids)
    kept = tf.ragged.boolean_mask(ids, keep)
    text = tf.strings.reduce_join(self.id_to_string(kept), axis=-1)
    text = tf.strings.regex_replace(text, _SPACE, " ")
    return tf.strings.regex_replace(text, "^ ", "")


class MarianVocabulary:
  """An imported Marian model's vocabulary: what `data/vocabulary.py`'s
  `Vocabulary` offers the commands that translate and export.

  Args:
    files: {name: bytes} of `FILES`.
    path: where they came from, for errors.
  """

  def __init__(self, files, path=FOLDER):
    self.files = dict(files)
    pieces, (pad, unk, eos) = read_pieces(
        self.files["vocab.json"], os.path.join(path, "vocab.json"))
    self.order = vocabulary_order(len(pieces), pad, unk, eos)
    self.piece_list = [pieces[i] for i in self.order]
    self.vocab_size = len(pieces)
    # What `Vocabulary.model_proto` is for comparisons and hashes.
    self.model_proto = hashlib.sha256(b"".join(
        self.files[name] for name in FILES)).digest()

  def make_tokenizer(self) -> MarianTokenizer:
    return MarianTokenizer(self.files["source.spm"], self.piece_list,
                           self.files["target.spm"])

  def tokenize(self, text):
    return self.make_tokenizer().tokenize(text)

  def detokenize(self, ids):
    return self.make_tokenizer().detokenize(ids)

  def pieces(self, ids):
    """The subword strings of `ids`, for inspection."""
    return self.make_tokenizer().id_to_string(ids)

  @property
  def target(self):
    """What cuts target text (`sequences.target_side`): target.spm."""
    return self.make_tokenizer().target

  def processor(self, side="source"):
    """`side`'s text -> our ids in Python, for tokenizing a training corpus
    on many threads (`token_store`), as the graph does."""
    return _SideIds(MarianPieces(self.files["source.spm"],
                                 self.files["target.spm"]), side,
                    {p: i for i, p in enumerate(self.piece_list)})

  @staticmethod
  def read_files(directory, names=FILES):
    """{name: bytes} of `names` in `directory`."""
    files = {}
    for name in names:
      path = os.path.join(directory, name)
      if not tf.io.gfile.exists(path):
        raise DataError(f"{path}: missing (a Marian model ships "
                        f"{', '.join(FILES)})")
      with tf.io.gfile.GFile(path, "rb") as f:
        files[name] = f.read()
    return files

  @classmethod
  def from_files(cls, directory):
    """From a directory holding source.spm, target.spm and vocab.json."""
    return cls(cls.read_files(directory), directory)

  @classmethod
  def load(cls, model_dir):
    return cls.from_files(os.path.join(model_dir, FOLDER))

  def save(self, model_dir):
    folder = os.path.join(model_dir, FOLDER)
    tf.io.gfile.makedirs(folder)
    for name, data in self.files.items():
      with tf.io.gfile.GFile(os.path.join(folder, name), "wb") as f:
        f.write(data)
    return folder


class MarianPieces:
  """The same text <-> pieces as `MarianTokenizer`, in Python, for engines
  that take pieces (CTranslate2, `translators/ct2_runtime.py`) and for
  tokenizing a training corpus (`token_store`).

  Args:
    source_spm, target_spm: the two SentencePiece model protos.
  """

  def __init__(self, source_spm, target_spm):
    import sentencepiece as spm  # pylint: disable=g-import-not-at-top
    self.spm = {side: spm.SentencePieceProcessor(model_proto=proto)
                for side, proto in (("source", source_spm),
                                    ("target", target_spm))}

  @classmethod
  def from_folder(cls, folder):
    """From `folder`'s source.spm and target.spm (`FOLDER` of a run or of a
    CTranslate2 export)."""
    files = MarianVocabulary.read_files(folder, FILES[:2])
    return cls(files["source.spm"], files["target.spm"])

  def encode(self, side, texts, num_threads=-1):
    """`side` ("source" or "target") strings -> their pieces, no EOS; a
    leading target-language token is one piece (`_LANGUAGE_CODE`)."""
    codes, rests = [], []
    for text in texts:
      end = text.find("<<") if text.startswith(">>") else -1
      codes.append([text[:end + 2]] if end != -1 else [])
      rests.append(text[end + 2:] if end != -1 else text)
    pieces = self.spm[side].encode(rests, out_type=str,
                                   num_threads=num_threads)
    return [code + p for code, p in zip(codes, pieces)]

  def source(self, texts):
    """Source strings -> their pieces, no EOS."""
    return self.encode("source", list(texts))

  def target(self, texts):
    """Target strings (prefixes, scored translations) -> their pieces."""
    return self.encode("target", list(texts))

  @staticmethod
  def decode(pieces):
    """Output pieces -> text, as `MarianTokenizer.detokenize`."""
    text = "".join(p for p in pieces if p not in ("<pad>", "<unk>", "</s>"))
    text = text.replace(_SPACE, " ")
    return text[1:] if text.startswith(" ") else text


class _SideIds:
  """One side's text -> our ids in Python (`MarianVocabulary.processor`),
  what `token_store` asks of a SentencePiece processor."""

  def __init__(self, pieces, side, ids):
    self.pieces, self.side, self.ids = pieces, side, ids

  def encode(self, texts, num_threads=-1):
    return [[self.ids.get(p, special_ids.UNK_ID) for p in row]
            for row in self.pieces.encode(self.side, list(texts),
                                          num_threads)]


def is_marian(model_dir):
  """Whether `model_dir` holds an imported Marian model's vocabulary."""
  return tf.io.gfile.exists(os.path.join(model_dir, FOLDER, "vocab.json"))
