"""A run directory turned into what the commands use: its model and
vocabulary (`run_dir.load_trained_model`), an in-process `TranslationModule`
(the export's own graph code, unsaved), or a `Translator` over it."""

from tf_transformer.decoding.search import DecodingOptions
from tf_transformer.decoding.translation_module import TranslationModule
from tf_transformer.decoding.translator import Translator
from tf_transformer.run import run_dir


def trained(model_dir, checkpoint=None, **options):
  """(model, vocabulary, DecodingOptions) of `checkpoint` (default: the
  newest in `model_dir`); `options`: DecodingOptions fields (None keeps the
  config's). A bad option raises ValueError naming it."""
  model, vocabulary = run_dir.load_trained_model(model_dir, checkpoint)
  try:
    decoding = DecodingOptions.from_config(model.config, **options)
  except ValueError as e:
    raise ValueError(f"decoding flags: {e}") from None
  return model, vocabulary, decoding


def translation_module(model_dir, checkpoint=None, **options):
  """The `TranslationModule` of `trained(model_dir, checkpoint,
  **options)`."""
  return TranslationModule(*trained(model_dir, checkpoint, **options))


def translator(model_dir, checkpoint=None, **options):
  """A `Translator` over `translation_module(model_dir, checkpoint,
  **options)`, run in-process (for an export: `Translator.from_export`)."""
  return Translator.from_module(translation_module(model_dir, checkpoint,
                                                   **options))
