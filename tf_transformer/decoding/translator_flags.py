"""absl flags that pick a model to translate with, for bin/ scripts."""

from absl import app
from absl import flags

from tf_transformer.decoding.translator import Translator


def define_flags():
  flags.DEFINE_string("model", None, "An exported SavedModel (NAME/VERSION).")
  flags.DEFINE_string("model_dir", None, "Or a training run / averaged model.")
  flags.DEFINE_integer("batch_size", 32, "Sentences per batch.")
  flags.DEFINE_integer("beam_size", None, "Beam size (--model_dir only; an "
                       "export's beam is fixed when exporting).")
  flags.DEFINE_float("alpha", None, "Length penalty (--model_dir only).")
  flags.DEFINE_integer("max_length_offset", None, "Output tokens beyond the "
                       "input length (--model_dir only).")


def make_translator(values=None) -> Translator:
  values = values or flags.FLAGS
  if bool(values.model) == bool(values.model_dir):
    raise app.UsageError("pass exactly one of --model and --model_dir")
  if values.model:
    if any(v is not None for v in (values.beam_size, values.alpha,
                                   values.max_length_offset)):
      raise app.UsageError("--beam_size/--alpha/--max_length_offset are fixed "
                           "in an export; re-export, or use --model_dir")
    return Translator.from_saved_model(values.model)
  return Translator.from_model_dir(values.model_dir, values.beam_size,
                                   values.alpha, values.max_length_offset)
