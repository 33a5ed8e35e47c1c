"""A run directory turned into what the commands use: its model and
vocabulary (`run_dir.load_trained_model`), or an in-process
`TranslationModule` (the export's own graph code, unsaved; the one way to
open a translator is `runner.open_translator`); several run directories,
into an ensemble of their models."""

import os

from tf_transformer.data import shortlist_table
from tf_transformer.decoding import ensemble as ensemble_lib
from tf_transformer.decoding.shortlist import Shortlist
from tf_transformer.decoding.search import DecodingOptions
from tf_transformer.serving.translation_module import TranslationModule
from tf_transformer.run import run_dir


def trained(model_dir, checkpoint=None, ensemble_average="log_probs",
            **options):
  """(model, vocabulary, DecodingOptions) of `checkpoint` (default: the
  newest in `model_dir`); `options`: DecodingOptions fields (None keeps the
  config's). A bad option raises ValueError naming it.

  `model_dir` may be a list: several runs, or checkpoints in them
  (RUN/ckpt-N), of one vocabulary, which decode as an
  `ensemble.Ensemble` combined by `ensemble_average`; the decoding options
  are then the first member's config's."""
  paths = [model_dir] if isinstance(model_dir, str) else list(model_dir)
  if len(paths) == 1:
    model, vocabulary = run_dir.load_trained_model(paths[0], checkpoint)
  else:
    model, vocabulary = _ensemble(paths, checkpoint, ensemble_average)
  try:
    decoding = DecodingOptions.from_config(model.config, **options)
  except ValueError as e:
    raise ValueError(f"decoding flags: {e}") from None
  return model, vocabulary, decoding


def _ensemble(paths, checkpoint, average):
  """(Ensemble, vocabulary) of the runs or checkpoints `paths`, each
  restored as `run_dir.load_trained_model` restores one; `checkpoint` may
  only be "best" (each run's best). Raises ValueError where the members'
  vocabularies differ, naming both."""
  if checkpoint not in (None, "best"):
    raise ValueError(
        f"--checkpoint={checkpoint} with {len(paths)} --model_dir: give each "
        "member's checkpoint as its --model_dir (RUN/ckpt-N) instead")
  members, vocabulary = [], None
  for path in paths:
    if os.path.exists(os.path.join(path, run_dir.CONFIG)):
      directory, member_checkpoint = path, checkpoint
    elif checkpoint:
      raise ValueError(f"--checkpoint={checkpoint}: --model_dir={path} is "
                       "a checkpoint, not a run")
    else:
      directory, member_checkpoint = run_dir.run_and_checkpoint(
          path, "--model_dir")
    model, member_vocabulary = run_dir.load_trained_model(directory,
                                                          member_checkpoint)
    if vocabulary is None:
      vocabulary, first = member_vocabulary, path
    elif member_vocabulary.model_proto != vocabulary.model_proto:
      raise ValueError(
          f"--model_dir={path} has another vocabulary than --model_dir="
          f"{first}: an ensemble's members score the same subwords, so they "
          "must share one vocabulary.model (train them from one bin/"
          "prepare_data.py run, or fine-tune with --init_from)")
    members.append(model)
  return ensemble_lib.Ensemble(members, average), vocabulary


def load_shortlist(model_dir, vocabulary, k, n) -> Shortlist:
  """The `Shortlist` of MODEL_DIR's table (`data/shortlist_table.py`): K
  candidates a source piece, the N most frequent pieces. Raises DataError
  naming the file, ValueError where the table holds fewer."""
  table = shortlist_table.load(model_dir, vocabulary)
  return Shortlist(*table.cut(k, n))


def translation_module(model_dir, checkpoint=None,
                       ensemble_average="log_probs", shortlist=None,
                       **options):
  """The `TranslationModule` of `trained(model_dir, checkpoint,
  ensemble_average, **options)`, searching over `shortlist` (K, N) of the
  (first) run's table where given."""
  model, vocabulary, decoding = trained(model_dir, checkpoint,
                                        ensemble_average, **options)
  if shortlist:
    first = model_dir if isinstance(model_dir, str) else model_dir[0]
    if not os.path.exists(os.path.join(first, run_dir.CONFIG)):
      first = os.path.dirname(first.rstrip("/"))  # RUN/ckpt-N
    shortlist = load_shortlist(first, vocabulary, *shortlist)
  return TranslationModule(model, vocabulary, decoding, shortlist=shortlist)
