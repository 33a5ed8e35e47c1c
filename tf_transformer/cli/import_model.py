r"""Imports a published or foreign model as a run directory that
bin/export.py, bin/translate.py, bin/evaluate.py, bin/score.py and
bin/train.py --init_from take (docs/serving.md): a Transformers
MarianMTModel directory (`tf_transformer/interop/marian.py`), a
Marian release (`tf_transformer/interop/marian_npz.py`) or an OpenNMT-tf
Transformer's checkpoint (`tf_transformer/interop/opennmt_tf.py`).

  bin/import_model.py --from=opus-mt-en-de --model_dir=runs/opus-mt-en-de
  bin/import_model.py --from=onmt_run --opennmt_model=TransformerBase \
      --vocabulary=vocab.txt --sentencepiece=sp.model --model_dir=runs/onmt
  bin/export.py --model_dir=runs/opus-mt-en-de --export_dir=saved_models/en-de

--from holds source.spm, target.spm and either config.json,
model.safetensors (or pytorch_model.bin, read only where torch is
installed) and vocab.json, or Marian's model .npz and *.vocab.yml; or it is
an OpenNMT-tf run directory (its avg/ average where it has one, else its
latest checkpoint) or checkpoint prefix, read with TensorFlow alone. The
format is said in one line. What the model cannot hold exactly is refused
in one line naming the setting; nothing is written then.
"""

import sys

from absl import app
from absl import flags
from absl import logging

from tf_transformer import command

FLAGS = flags.FLAGS
flags.DEFINE_string("from", None, "The model to import: a Transformers "
                    "MarianMTModel directory (config.json, "
                    "model.safetensors, vocab.json) or a Marian release "
                    "(model .npz, *.vocab.yml), each with source.spm and "
                    "target.spm; or an OpenNMT-tf run directory or "
                    "checkpoint prefix.")
flags.DEFINE_string("model_dir", None, "The run directory to write (must "
                    "not exist).")
flags.DEFINE_string("opennmt_model", None, "OpenNMT-tf only: the model type "
                    "it was trained as, from OpenNMT-tf's catalog "
                    "(Transformer, TransformerBase, TransformerBig, "
                    "TransformerBaseSharedEmbeddings, ...), or 'custom' "
                    "with --num_heads and --activation.")
flags.DEFINE_integer("num_heads", None, "--opennmt_model=custom only: its "
                     "attention heads.")
flags.DEFINE_enum("activation", None, ["relu", "gelu_tanh"],
                  "--opennmt_model=custom only: its feed-forward activation "
                  "(gelu_tanh: opennmt.layers.gelu).")
flags.DEFINE_list("vocabulary", None, "OpenNMT-tf only: its vocabulary file, "
                  "or the source and target files (equal: one joint "
                  "vocabulary).")
flags.DEFINE_list("sentencepiece", None, "OpenNMT-tf only: the SentencePiece "
                  "model that cut its text into the vocabulary's pieces, or "
                  "the source and target models.")
flags.DEFINE_list("tokenization", None, "OpenNMT-tf only, instead of "
                  "--sentencepiece: its tokenization config (the YAML file "
                  "of source_tokenization), or the source's and the "
                  "target's; options SentencePiece alone does not "
                  "reproduce are refused.")
flags.DEFINE_boolean("source_eos", None, "OpenNMT-tf only: whether it was "
                     "trained with EOS at the end of each source "
                     "(source_sequence_controls end: true); default: the "
                     "model type's (true for ScalingNmtEnDe/EnFr, else "
                     "false).")
flags.mark_flag_as_required("from")
flags.mark_flag_as_required("model_dir")
_OPENNMT_FLAGS = ("opennmt_model", "num_heads", "activation", "vocabulary",
                  "sentencepiece", "tokenization", "source_eos")


def _pair(name):
  """A one-or-two-item list flag as (source, target)."""
  values = getattr(FLAGS, name)
  if len(values) not in (1, 2):
    raise app.UsageError(f"--{name}: one file, or the source's and the "
                         "target's")
  return values[0], values[-1]


def _import_opennmt(import_run):
  from tf_transformer.interop import opennmt_tf  # pylint: disable=g-import-not-at-top
  for name in ("opennmt_model", "vocabulary"):
    if getattr(FLAGS, name) is None:
      raise app.UsageError(f"--from={getattr(FLAGS, 'from')} is an "
                           f"OpenNMT-tf checkpoint: --{name} is needed")
  if (FLAGS.sentencepiece is None) == (FLAGS.tokenization is None):
    raise app.UsageError("an OpenNMT-tf checkpoint needs one of "
                         "--sentencepiece and --tokenization")
  try:
    kind = opennmt_tf.model_type(FLAGS.opennmt_model, FLAGS.num_heads,
                                 FLAGS.activation)
  except ValueError as e:
    raise app.UsageError(str(e)) from None
  sentencepieces = (_pair("sentencepiece") if FLAGS.tokenization is None
                    else tuple(opennmt_tf.tokenization_model(p)
                               for p in _pair("tokenization")))
  return import_run.import_opennmt(
      getattr(FLAGS, "from"), FLAGS.model_dir, kind, _pair("vocabulary"),
      sentencepieces, FLAGS.source_eos)


def main(argv):
  del argv
  from tf_transformer.run import import_run  # pylint: disable=g-import-not-at-top
  logging.set_verbosity(logging.WARNING)  # not the checkpoint's info lines
  try:
    kind = import_run.detect_format(getattr(FLAGS, "from"))
    if kind == import_run.OPENNMT:
      result = _import_opennmt(import_run)
    else:
      given = [n for n in _OPENNMT_FLAGS if getattr(FLAGS, n) is not None]
      if given:
        raise app.UsageError(f"--{given[0]} is for an OpenNMT-tf checkpoint;"
                             f" --from={getattr(FLAGS, 'from')} is {kind}")
      result = import_run.import_marian(getattr(FLAGS, "from"),
                                        FLAGS.model_dir)
  except (ValueError, FileNotFoundError, FileExistsError) as e:
    return command.fail("import_model", e, 2)
  print(f"import_model: reading {result['read']}", file=sys.stderr)
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
