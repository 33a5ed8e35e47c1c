r"""Imports a published Marian model (OPUS-MT) as a run directory that
bin/export.py, bin/translate.py, bin/evaluate.py and bin/score.py take
(docs/serving.md): a Transformers MarianMTModel directory
(`tf_transformer/serving/marian_import.py`) or a Marian release
(`tf_transformer/serving/marian_npz.py`).

  bin/import_model.py --from=opus-mt-en-de --model_dir=runs/opus-mt-en-de
  bin/export.py --model_dir=runs/opus-mt-en-de --export_dir=saved_models/en-de

--from holds source.spm, target.spm and either config.json,
model.safetensors (or pytorch_model.bin, read only where torch is
installed) and vocab.json, or Marian's model .npz and *.vocab.yml.
What the model cannot hold exactly is refused in one line naming the
setting; nothing is written then.
"""

import sys

from absl import flags
from absl import logging

from tf_transformer import command

FLAGS = flags.FLAGS
flags.DEFINE_string("from", None, "The published model's directory: a "
                    "Transformers MarianMTModel (config.json, "
                    "model.safetensors, vocab.json) or a Marian release "
                    "(model .npz, *.vocab.yml), with source.spm and "
                    "target.spm.")
flags.DEFINE_string("model_dir", None, "The run directory to write (must "
                    "not exist).")
flags.mark_flag_as_required("from")
flags.mark_flag_as_required("model_dir")


def main(argv):
  del argv
  from tf_transformer.run.import_run import import_marian  # pylint: disable=g-import-not-at-top
  logging.set_verbosity(logging.WARNING)  # not the checkpoint's info lines
  try:
    result = import_marian(getattr(FLAGS, "from"), FLAGS.model_dir)
  except (ValueError, FileNotFoundError, FileExistsError) as e:
    return command.fail("import_model", e, 2)
  for note in result["notes"]:
    print(f"import_model: note: {note}", file=sys.stderr)
  print(f"imported {result['parameters']:,} parameters in "
        f"{result['seconds']:.1f} s")
  print(f"wrote {result['model_dir']} "
        f"({command.megabytes(result['model_dir']):,.1f} MB)")
  return 0


def _kept():
  """What a full disk left: (nothing, --model_dir)."""
  return ("nothing was written; the partial run is removed", FLAGS.model_dir)


def run():
  """`tf-transformer-import-model`: parses the flags, then runs `main`."""
  command.run(main, kept=_kept)
