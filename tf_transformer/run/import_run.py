"""A published model turned into a run directory that every command takes
(`bin/import_model.py`): config.json, the checkpoint ckpt-1 and the
vocabulary (`data/marian_vocabulary.py`), written under a temporary name
and renamed, so a failed import leaves nothing. Three formats: a
Transformers MarianMTModel directory (`interop/marian.py`), a
Marian release (`interop/marian_npz.py`) and an OpenNMT-tf checkpoint
(`interop/opennmt_tf.py`), whose vocabulary is kept in the same form
(`data/marian_vocabulary.py`)."""

import os
import time

import tensorflow as tf

from tf_transformer import whole_dir
from tf_transformer.data.marian_vocabulary import MarianVocabulary
from tf_transformer.run import run_dir
from tf_transformer.interop import marian
from tf_transformer.interop import marian_npz
from tf_transformer.interop import opennmt_tf

TRANSFORMERS = "a Transformers MarianMTModel directory"
MARIAN = "a Marian release"
OPENNMT = "an OpenNMT-tf checkpoint"


def detect_format(path):
  """Which of `TRANSFORMERS`, `MARIAN` and `OPENNMT` `path` holds."""
  if opennmt_tf.is_checkpoint(path):
    return OPENNMT
  if not tf.io.gfile.isdir(path):
    raise FileNotFoundError(f"--from={path}: no such directory or "
                            "checkpoint")
  if tf.io.gfile.exists(os.path.join(path, marian.CONFIG)):
    return TRANSFORMERS
  return MARIAN


def _check_new(model_dir):
  if tf.io.gfile.exists(model_dir):
    raise FileExistsError(f"--model_dir={model_dir}: exists; an import "
                          "writes a new run directory")


def _write(model_dir, imported, vocabulary, started, said):
  """The run directory of `imported`, written whole."""
  with whole_dir.written(model_dir) as tmp:
    run_dir.save(tmp, imported.model.config)
    vocabulary.save(tmp)
    tf.train.CheckpointManager(tf.train.Checkpoint(model=imported.model),
                               tmp, max_to_keep=1).save()
  return {"model_dir": model_dir,
          "parameters": imported.model.count_params(),
          "seconds": time.perf_counter() - started,
          "notes": imported.notes, "read": said}


def import_marian(source_dir, model_dir):
  """Imports a published Marian model as run `model_dir`.

  Args:
    source_dir: a Transformers MarianMTModel directory (config.json,
      model.safetensors or pytorch_model.bin, vocab.json), or a Marian
      release (one model .npz, one *.vocab.yml); source.spm and target.spm
      in either.
    model_dir: the run directory to write; it must not exist.
  Returns:
    {"model_dir", "parameters", "seconds", "notes", "read": a line naming
    the format and what was read}.
  Raises:
    ValueError (DataError among them) naming the file and the setting;
    FileExistsError where `model_dir` exists.
  """
  started = time.perf_counter()
  kind = detect_format(source_dir)
  _check_new(model_dir)
  if kind == OPENNMT:
    raise ValueError(f"--from={source_dir}: {OPENNMT}, which needs "
                     "--opennmt_model, --vocabulary and --sentencepiece")
  if kind == TRANSFORMERS:
    vocabulary = MarianVocabulary.from_files(source_dir)
    imported = marian.from_transformers(source_dir)
  else:
    imported, vocab_json = marian_npz.from_marian(source_dir)
    vocabulary = MarianVocabulary(
        dict(MarianVocabulary.read_files(source_dir, ("source.spm",
                                                      "target.spm")),
             **{"vocab.json": vocab_json}), source_dir)
  return _write(model_dir, imported, vocabulary, started,
                f"{kind} {source_dir}")


def import_opennmt(path, model_dir, kind, vocabularies, sentencepieces,
                   source_eos=None):
  """Imports an OpenNMT-tf Transformer as run `model_dir`.

  Args:
    path: its run directory (avg/'s average where there is one, else the
      latest checkpoint) or a checkpoint prefix.
    model_dir: the run directory to write; it must not exist.
    kind: its `opennmt_tf.ModelType`.
    vocabularies: (source, target) OpenNMT vocabulary files.
    sentencepieces: (source, target) SentencePiece models that cut the
      text into the vocabulary's pieces.
    source_eos: whether it was trained with a source EOS; None: the
      type's default.
  Returns:
    As `import_marian`.
  Raises:
    As `import_marian`.
  """
  started = time.perf_counter()
  _check_new(model_dir)
  files = {}
  for name, spm_path in zip(("source.spm", "target.spm"), sentencepieces):
    if not tf.io.gfile.exists(spm_path):
      raise FileNotFoundError(f"{spm_path}: no such SentencePiece model")
    with tf.io.gfile.GFile(spm_path, "rb") as f:
      files[name] = f.read()
  imported, files["vocab.json"], said = opennmt_tf.from_opennmt(
      path, vocabularies, kind, source_eos)
  vocabulary = MarianVocabulary(files, vocabularies[0])
  return _write(model_dir, imported, vocabulary, started, said)
