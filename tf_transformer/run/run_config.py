"""What a run directory trains: the config and vocabulary of a new, resumed
or fine-tuned run, and the checks that keep a resume honest (same
architecture, same recipe unless allowed, same training data unless
allowed). `Runner.train` calls `fine_tuning_config` and `run_config` before
it builds a trainer."""

import dataclasses
import json
import os

from absl import logging

from tf_transformer import config as config_lib
from tf_transformer.data import prepare as prepare_lib
from tf_transformer.data import token_store
from tf_transformer.data import vocabulary as vocabulary_lib
from tf_transformer.run import run_dir

STATS_FILE = "data_stats.json"
# Depths a run started --init_from another may ask fewer of (a student).
DEPTHS = ("num_layers", "num_encoder_layers", "num_decoder_layers")


def fine_tuning_config(model_dir, config, init_dir, init_from, vocab_size):
  """`config` with `init_dir`'s vocabulary size, after checking that its
  architecture and vocabulary are the other run's; puts that vocabulary
  into a new run directory. Raises ValueError naming both."""
  theirs = run_dir.load_config(init_dir)
  asked = config.replace(vocab_size=theirs.model.vocab_size).flat()
  saved = theirs.flat()
  diff = {k: (saved[k], asked[k]) for k in config_lib.ARCHITECTURE_FIELDS
          if saved[k] != asked[k] and k not in DEPTHS}
  deeper = {k: (saved[k], asked[k]) for k in DEPTHS[1:]
            if asked[k] > saved[k]}
  if diff or deeper:
    raise ValueError(
        f"--init_from={init_from} has another architecture than asked "
        f"(theirs, asked): {diff or deeper}; leave out --config to take "
        "theirs, or pass the --config and --hparams it was trained with "
        "(fewer encoder or decoder layers may be asked: each stack takes "
        "their first ones)")
  shallower = {k: (saved[k], asked[k]) for k in DEPTHS[1:]
               if asked[k] < saved[k]}
  if shallower:
    logging.info(
        "--init_from=%s: %s; each stack takes its first layers and the "
        "embeddings, a shrunk teacher that fine-tuning adapts (Shleifer and "
        "Rush, 2020)", init_from, ", ".join(
            f"{asked[k]} of its {saved[k]} {k[4:].replace('_', ' ')}"
            for k in shallower))
  vocabulary = vocabulary_lib.Vocabulary.load(init_dir)
  if vocabulary_lib.Vocabulary.saved_in(model_dir):
    if vocabulary_lib.Vocabulary.load(model_dir).model_proto != (
        vocabulary.model_proto):
      raise ValueError(
          f"{model_dir} holds another vocabulary than "
          f"--init_from={init_from}'s ({init_dir}); fine-tuning keeps the "
          "vocabulary its weights were trained with: use a new --model_dir")
  else:
    if vocab_size and vocab_size != theirs.model.vocab_size:
      raise ValueError(
          f"--vocab_size={vocab_size}: --init_from={init_from} has "
          f"{theirs.model.vocab_size} pieces, which fine-tuning keeps; "
          "leave out --vocab_size")
    os.makedirs(model_dir, exist_ok=True)
    vocabulary.save(model_dir)
  return config.replace(vocab_size=theirs.model.vocab_size)


def run_config(model_dir, config, spec, chief, vocab_size, vocab_model_type,
               seed, max_length, allow_recipe_change, flags_text,
               allow_data_change=False):
  """(config, vocabulary) of the run: the saved ones when resuming."""
  if not chief:
    run_dir.wait_for(model_dir)
  if os.path.exists(os.path.join(model_dir, run_dir.CONFIG)):
    if chief:
      _check_same_data(model_dir, spec, allow_data_change)
    if isinstance(config, config_lib.AutoConfig):
      # The config the run started with, chosen by auto or named (a run
      # begun under the old default, --config=base, resumes as base).
      config = config.resumed(run_dir.load_config(model_dir))
    return _resumed_config(model_dir, config, chief, allow_recipe_change,
                                flags_text)
  if vocabulary_lib.Vocabulary.saved_in(model_dir):
    logging.info("using the vocabulary already in %s", model_dir)
    vocabulary = vocabulary_lib.Vocabulary.load(model_dir)
  else:
    logging.info("building the vocabulary from the training data")
    vocabulary = prepare_lib.build_vocabulary(
        spec, vocab_size, vocab_model_type, seed=seed)
    vocabulary.save(model_dir)
  stats = _statistics(model_dir, spec, vocabulary, max_length)
  if isinstance(config, config_lib.AutoConfig):
    config, reason = config.resolve(stats["train"]["pairs"])
    logging.info("%s", reason)
  config = config.replace(vocab_size=vocabulary.vocab_size)
  for split, split_stats in stats.items():
    if isinstance(split_stats, dict):
      logging.info(
          "%s: %d pairs, %d dropped as longer than --max_length=%d, %d "
          "with an empty side", split, split_stats["pairs"],
          split_stats["dropped_too_long"], max_length,
          split_stats["dropped_empty_side"])
  run_dir.save(model_dir, config, spec, flags_text, stats)
  return config, vocabulary


def _statistics(model_dir, spec, vocabulary, max_length):
  """The corpus statistics, after tokenizing the training pairs into
  token arrays; those `prepare` left are taken (never tokenized again),
  with the statistics it wrote where they used the same `max_length`."""
  prepared = token_store.all_written(model_dir, spec)
  stores = token_store.open_training(model_dir, spec, vocabulary)
  saved = os.path.join(model_dir, STATS_FILE)
  if prepared and os.path.exists(saved):
    with open(saved) as f:
      stats = json.load(f)
    if all(s.get("max_length") == max_length for s in stats.values()
           if isinstance(s, dict)):
      logging.info("using the token arrays and statistics bin/"
                   "prepare_data.py left in %s", model_dir)
      return stats
  return prepare_lib.corpus_statistics(spec, vocabulary, max_length,
                                       stores)


def _check_same_data(model_dir, spec, allow_data_change=False):
  """Refuses to resume on other training data, where the optimizer state
  and the step would carry over to it unannounced; with
  `allow_data_change`, records the new data instead. Raises
  ValueError."""
  path = os.path.join(model_dir, run_dir.DATA_SPEC)
  if not os.path.exists(path):
    return
  saved, asked = (token_store.training_data(run_dir.load_spec(
      model_dir)), token_store.training_data(spec))
  diff = {k: (saved[k], asked[k]) for k in saved if saved[k] != asked[k]}
  if diff and allow_data_change:
    logging.info("--allow_data_change: resuming on other data (was, "
                 "now): %s", diff)
    run_dir.save(model_dir, run_dir.load_config(model_dir), spec)
    token_store.remove(model_dir)  # tokenized again
  elif diff:
    raise ValueError(
        f"--model_dir={model_dir} was trained on other data (saved, "
        f"asked): {diff}; a resume would carry its optimizer state and "
        "step over to them. To fine-tune on the new data, start a new "
        f"--model_dir with --init_from={model_dir}; to go on "
        "training this run on them, add --allow_data_change")


def _resumed_config(model_dir, config, chief, allow_recipe_change, flags_text):
  """The saved run's config, with the asked runtime and decoding (and, if
  allowed, training recipe) fields. Decoding fields (beam, length
  penalty, length limit) touch neither weights nor training: a changed
  one is saved, so that the run's evaluations and exports use it."""
  saved = run_dir.load_config(model_dir)
  asked = config.replace(vocab_size=saved.model.vocab_size).flat()
  decoding = {f.name for f in dataclasses.fields(config_lib.DecodingConfig)}
  may_change = {"train_steps"} | decoding
  if allow_recipe_change:
    may_change |= set(asked) - set(config_lib.ARCHITECTURE_FIELDS)
  changed = {k: (v, asked[k]) for k, v in saved.flat().items()
             if asked[k] != v}  # (saved, asked)
  diff = {k: v for k, v in changed.items() if k not in may_change}
  if diff:
    fix = ("" if allow_recipe_change else
           "; to change only the training recipe and keep the weights, "
           "add --allow_recipe_change")
    raise ValueError(
        f"--model_dir={model_dir} holds a run with other hparams "
        f"(saved, asked): {diff}: resume with the same flags or use a new "
        f"--model_dir{fix}")
  resumed = saved.replace(**{k: asked[k] for k in may_change})
  if (allow_recipe_change or decoding & set(changed)) and chief and (
      resumed != saved):
    logging.info("resuming with %s (was, now)", changed)
    run_dir.save(model_dir, resumed, flags_text=flags_text)
  return resumed, vocabulary_lib.Vocabulary.load(model_dir)
