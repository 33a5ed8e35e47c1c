"""A published model turned into a run directory that every command takes
(`bin/import_model.py`): config.json, the checkpoint ckpt-1 and the
vocabulary (`data/marian_vocabulary.py`), written under a temporary name
and renamed, so a failed import leaves nothing. Two formats: a
Transformers MarianMTModel directory (`serving/marian_import.py`) and a
Marian release (`serving/marian_npz.py`)."""

import os
import time

import tensorflow as tf

from tf_transformer import whole_dir
from tf_transformer.data.marian_vocabulary import MarianVocabulary
from tf_transformer.run import run_dir
from tf_transformer.serving import marian_import
from tf_transformer.serving import marian_npz


def import_marian(source_dir, model_dir):
  """Imports a published Marian model as run `model_dir`.

  Args:
    source_dir: a Transformers MarianMTModel directory (config.json,
      model.safetensors or pytorch_model.bin, vocab.json), or a Marian
      release (one model .npz, one *.vocab.yml); source.spm and target.spm
      in either.
    model_dir: the run directory to write; it must not exist.
  Returns:
    {"model_dir", "parameters", "seconds", "notes"}.
  Raises:
    ValueError (DataError among them) naming the file and the setting;
    FileExistsError where `model_dir` exists.
  """
  started = time.perf_counter()
  if not tf.io.gfile.isdir(source_dir):
    raise FileNotFoundError(f"--from={source_dir}: no such directory")
  if tf.io.gfile.exists(model_dir):
    raise FileExistsError(f"--model_dir={model_dir}: exists; an import "
                          "writes a new run directory")
  if tf.io.gfile.exists(os.path.join(source_dir, marian_import.CONFIG)):
    vocabulary = MarianVocabulary.from_files(source_dir)
    imported = marian_import.from_transformers(source_dir)
  else:
    imported, vocab_json = marian_npz.from_marian(source_dir)
    vocabulary = MarianVocabulary(
        dict(MarianVocabulary.read_files(source_dir, ("source.spm",
                                                      "target.spm")),
             **{"vocab.json": vocab_json}), source_dir)
  with whole_dir.written(model_dir) as tmp:
    run_dir.save(tmp, imported.model.config)
    vocabulary.save(tmp)
    tf.train.CheckpointManager(tf.train.Checkpoint(model=imported.model),
                               tmp, max_to_keep=1).save()
  return {"model_dir": model_dir,
          "parameters": imported.model.count_params(),
          "seconds": time.perf_counter() - started,
          "notes": imported.notes}
