"""The run layer's one object: a run directory and what is done with it.

`Runner(model_dir)` builds the vocabulary and corpus statistics (`prepare`),
trains and resumes (`train`), averages checkpoints (`average`), exports
(`export`) and opens a translator (`translator`); `translate` and `evaluate`
work on any translator, a run's or an export's. Each takes values, never
flags, and returns its results, so bin/ scripts turn flags into one call and
bin/main_job.py chains the calls in one process (as OpenNMT-tf's `Runner`
does).
"""

import contextlib
import dataclasses
import gc
import json
import os
from typing import List

from absl import logging
import keras

from tf_transformer import evaluation
from tf_transformer.choices import ALIGNMENT_LAYER_WITH_SAVED_MODEL
from tf_transformer.choices import DTYPES
from tf_transformer.progress import Progress
from tf_transformer.data import corpora
from tf_transformer.data import prepare as prepare_lib
from tf_transformer.data import shortlist_table
from tf_transformer.data import sources
from tf_transformer.data import token_store
from tf_transformer.data import vocabulary as vocabulary_lib
from tf_transformer.decoding import ensemble as ensemble_lib
from tf_transformer.decoding.search import refuse_xla_with_shortlist
from tf_transformer.translators.scorer import Scorer
from tf_transformer.serving.translation_module import TranslationModule
from tf_transformer.translators.translator import Translator
from tf_transformer.model import build_model
from tf_transformer.model import with_dtype_policy
from tf_transformer.run import loading
from tf_transformer.run import model_path
from tf_transformer.run import run_config
from tf_transformer.run import run_dir
from tf_transformer.interop import ct2
from tf_transformer.interop import marian
from tf_transformer.serving import export as export_lib
from tf_transformer.training import run_lock
from tf_transformer.training import strategy as strategy_lib
from tf_transformer.training import best as best_lib
from tf_transformer.training import precision
from tf_transformer.training import evaluator
from tf_transformer.training import trainer as trainer_lib
from tf_transformer.training.checkpoints import average_checkpoints
from tf_transformer.training.checkpoints import CheckpointError

# Trainers stopped by a signal, never freed (`Runner.train`).
_STOPPED_TRAINERS = []


@dataclasses.dataclass
class Prepared:
  vocabulary: vocabulary_lib.Vocabulary
  stats: dict  # prepare.corpus_statistics: pairs, tokens, lengths, drops
  written: List[str]  # the text files of `write_text`


@dataclasses.dataclass
class Averaged:
  path: str  # the averaged checkpoint, in its own model directory
  checkpoints: List[str]  # the checkpoints it averages


@dataclasses.dataclass
class Evaluation:
  hypotheses: List[str]
  scores: dict  # evaluation.score: bleu, chrf, exact_match, signatures
  warnings: List[str]  # inputs the translator had to cut


class Runner:
  """A training run's directory: config, data spec, vocabulary,
  checkpoints and summaries (`run_dir`)."""

  def __init__(self, model_dir: str):
    self.model_dir = model_dir

  def prepare(self, spec, vocab_size=None, vocab_model_type="bpe",
              vocab_max_sentences=5_000_000, max_length=256, seed=0,
              write_text=()) -> Prepared:
    """Trains and saves the shared SentencePiece vocabulary of `spec`'s
    training pairs, writes the corpus statistics (data_stats.json) and,
    for each split in `write_text`, its pairs as two line-aligned files."""
    vocabulary = prepare_lib.build_vocabulary(
        spec, vocab_size, vocab_model_type, vocab_max_sentences, seed)
    vocabulary.save(self.model_dir)
    token_store.remove(self.model_dir)  # this vocabulary's, written anew
    stores = token_store.open_training(self.model_dir, spec, vocabulary)
    stats = prepare_lib.corpus_statistics(spec, vocabulary, max_length,
                                          stores)
    with open(os.path.join(self.model_dir, run_config.STATS_FILE), "w") as f:
      json.dump(stats, f, indent=2)
    return Prepared(vocabulary, stats,
                    _write_text(spec, self.model_dir, write_text))

  def train(self, config, spec, strategy=None, stop=None, vocab_size=None,
            vocab_model_type="bpe", allow_recipe_change=False,
            ignore_run_lock=False, flags_text="", init_from=None,
            allow_data_change=False, **options) -> dict:
    """Trains `config` on `spec` into the run directory, or resumes it.

    A new run builds its vocabulary (or takes the one `prepare` left) and
    saves config, spec and statistics; a resumed one must ask for the same
    architecture, unless `allow_recipe_change` the same recipe, and unless
    `allow_data_change` the same training data. `init_from` (another run,
    or a checkpoint) starts a new run from its model weights, with its
    vocabulary and architecture and a fresh optimizer, step and schedule.
    `config` may be a `config.AutoConfig`, chosen by the training pairs
    (logged with the reason). `options`: `TrainOptions` fields (steps and
    batch size are `config.training`'s). Returns `Trainer.train`'s result:
    step, losses, dev metrics, checkpoint, stopped_by, time_up,
    weights_fingerprint.
    Raises DataError, ValueError, DivergedError (NaN, Inf or a runaway
    loss) or RunLockedError.
    """
    strategy = strategy or strategy_lib.create_strategy("one_device")
    chief = strategy_lib.is_chief(strategy)
    lock = (run_lock.RunLock(self.model_dir, ignore_run_lock) if chief
            else contextlib.nullcontext())
    init_dir, init_checkpoint = (run_dir.run_and_checkpoint(init_from)
                                 if init_from else (None, None))
    train_options = trainer_lib.TrainOptions(
        model_dir=self.model_dir, init_from=init_checkpoint, **options)
    with lock:
      if init_dir and chief:
        config = run_config.fine_tuning_config(
            self.model_dir, config, init_dir, init_from, vocab_size)
      config, vocabulary = run_config.run_config(
          self.model_dir, config, spec, chief, vocab_size, vocab_model_type,
          train_options.seed, train_options.max_length, allow_recipe_change,
          flags_text, allow_data_change)
      mixed_precision, why = precision.resolve(
          self.model_dir, train_options.mixed_precision, config,
          strategy_lib.num_workers(strategy))
      if why:
        logging.info("mixed precision: %s", why)
      train_options = dataclasses.replace(train_options,
                                          mixed_precision=mixed_precision)
      logging.info("%s on %d replica(s): %s", type(strategy).__name__,
                   strategy.num_replicas_in_sync, config)
      policy = keras.mixed_precision.global_policy()
      try:
        trainer = trainer_lib.Trainer(config, vocabulary, spec,
                                      train_options, strategy)
        result = trainer.train(stop)
      finally:
        # The trainer sets Keras' global policy (mixed precision); what this
        # process builds next (the main job's export) gets the caller's.
        keras.mixed_precision.set_global_policy(policy)
    if result["stopped_by"]:
      # Freeing a trainer joins its input pipeline's threads, which wait for
      # the element in flight: 2 to 26 s measured after a stop. A stopped
      # run's process is about to end (bin/ commands then leave with
      # `command.exit_now`): keep it.
      _STOPPED_TRAINERS.append(trainer)
      return result
    del trainer
    # The trainer's traced functions stay registered until collected, and
    # make later tracing in this process (an export) three times slower.
    gc.collect()
    return result

  def average(self, num_checkpoints, output_dir, last_step=None) -> Averaged:
    """Averages the model variables of the last `num_checkpoints` (section
    6.1; with `last_step`, the last at or before that step, or "best": the
    step of the run's best dev evaluation) into `output_dir`, a model
    directory export and translate take. Raises CheckpointError or
    FileNotFoundError."""
    config = run_dir.load_config(self.model_dir)
    if last_step == "best":
      best = best_lib.read_best(self.model_dir)
      if not best:
        raise CheckpointError(
            f"--last_step=best: {self.model_dir} has no best checkpoint "
            f"({best_lib.BEST_DIR}/{best_lib.BEST_FILE}); it is kept by dev "
            "evaluations (bin/train.py --eval_every_steps)")
      last_step = best["step"]
    model = build_model(config)
    path, averaged = average_checkpoints(model, self.model_dir,
                                         num_checkpoints, output_dir,
                                         last_step=last_step)
    return Averaged(path, averaged)

  def export(self, export_dir, checkpoint=None, format="saved_model",  # pylint: disable=redefined-builtin
             max_input_tokens=256, xla=False, decode_parts=1,
             quantization=None, dtype="float32", on_stage=None,
             ensemble=(), ensemble_average="log_probs", shortlist=None,
             alignment_layer=None, **decoding) -> str:
    """Exports `checkpoint` (default: the newest) as the next SavedModel
    version of `export_dir`, its weights and matmuls in `dtype` ("float32"
    or "bfloat16"), or with format="ctranslate2" as a CTranslate2 model
    directory, or with format="transformers" as a Transformers
    `MarianMTModel` directory; returns its path. `ensemble`: more runs (or
    checkpoints in them) of this run's vocabulary, whose models decode with
    this one as one ensemble (`decoding/ensemble.py`, combined by
    `ensemble_average`), in one SavedModel with the same signatures. `decoding`: DecodingOptions
    fields (None keeps the config's); `on_stage(text)` hears of each stage
    and warning. `shortlist` (K, N): every search decodes over its
    request's shortlist of the run's table (`build_shortlist`), K
    candidates a source piece and the N most frequent pieces; a
    CTranslate2 export gets the same table as its `vmap`.
    `alignment_layer`: the decoder layer (from 1; default the last) whose
    attention a CTranslate2 export keeps for word alignments (a SavedModel
    keeps every layer's). Raises ValueError
    naming a bad option, DataError (no table), FileNotFoundError,
    ImportError (CTranslate2 not installed)."""
    on_stage = on_stage or (lambda text: None)
    if ensemble and format != "saved_model":
      raise ValueError(f"{1 + len(ensemble)} --model_dir: an ensemble "
                       "exports only as --format=saved_model (CTranslate2 "
                       "and Transformers decode one model)")
    if xla and format != "saved_model":
      raise ValueError("--xla: only for --format=saved_model")
    if quantization and format != "ctranslate2":
      raise ValueError("--quantization: only with --format=ctranslate2")
    if alignment_layer is not None and format != "ctranslate2":
      raise ValueError(ALIGNMENT_LAYER_WITH_SAVED_MODEL)
    if dtype not in DTYPES:
      raise ValueError(f"--dtype={dtype}: expected one of "
                       f"{', '.join(DTYPES)}")
    if dtype != "float32" and format != "saved_model":
      raise ValueError(f"--dtype={dtype}: only for --format=saved_model "
                       "(CTranslate2 stores its types by --quantization; "
                       "a Transformers model is float32)")
    refuse_xla_with_shortlist(xla, bool(shortlist))
    if shortlist and format == marian.FORMAT:
      raise ValueError("--shortlist: a Transformers model has no vocabulary "
                       "shortlist; only --format=saved_model or ctranslate2")
    if checkpoint == "best" and not ensemble:
      checkpoint = best_lib.best_checkpoint(self.model_dir)
    model, vocabulary, options = loading.trained(
        [self.model_dir, *ensemble], checkpoint, ensemble_average,
        **decoding)
    if shortlist:
      shortlist = loading.load_shortlist(self.model_dir, vocabulary,
                                         *shortlist)
    on_stage(f"restored the weights of {checkpoint or self.model_dir}"
             + "".join(f" and {path}" for path in ensemble))
    if dtype == "bfloat16":
      model = (ensemble_lib.Ensemble(
          [with_dtype_policy(m, dtype) for m in model.members],
          ensemble_average) if ensemble else with_dtype_policy(model, dtype))
      on_stage("weights and matmuls in bfloat16")
      warning = export_lib.bfloat16_warning()
      if warning:
        on_stage(f"warning: {warning}")
    elif format == "saved_model" and export_lib.float32_note():
      on_stage(f"note: {export_lib.float32_note()}")
    if format == marian.FORMAT:
      path = marian.export(model, vocabulary, export_dir,
                           options, max_input_tokens)
      on_stage(f"wrote the Transformers MarianMTModel {path}")
      return path
    if format == "ctranslate2":
      path = ct2.export(model, vocabulary, export_dir, options,
                        max_input_tokens, quantization, shortlist,
                        alignment_layer)
      on_stage(f"wrote the CTranslate2 model {path}")
      return path
    module = TranslationModule(model, vocabulary, options, max_input_tokens,
                               xla=xla, decode_parts=decode_parts,
                               shortlist=shortlist)
    on_stage(f"tracing the {options.method} search into its signatures and "
             f"writing the next version of {export_dir} ...")
    path = export_lib.export(module, export_dir, on_stage)
    on_stage(f"wrote {path}")
    return path

  def build_shortlist(self, k_max=50, n_max=1000, max_pairs=1_000_000):
    """Counts the run's training pairs (their token arrays, tokenized now
    where preparation or training left none) into its shortlist table,
    `data/shortlist_table.py`, and writes it; returns (table, path)."""
    spec = run_dir.load_spec(self.model_dir)
    vocabulary = vocabulary_lib.Vocabulary.load(self.model_dir)
    stores = [store for store, _ in token_store.open_training(
        self.model_dir, spec, vocabulary)]
    with Progress("counted", min(max_pairs, sum(
        store.num_pairs for store in stores)), "pairs") as progress:
      table = shortlist_table.build(stores, vocabulary, k_max, n_max,
                                    max_pairs, progress)
    return table, shortlist_table.save(table, self.model_dir)

  def dev_scores(self, checkpoint=None, decoding="greedy",
                 max_sentences=0) -> dict:
    """{"bleu", "exact_match", "loss", "nll", "hypotheses", "references"}
    of `checkpoint` (default: the newest) on the run's dev split, scored as
    training scores it (`training.evaluator`): translated by `decoding`
    "greedy" or "beam" (the first `max_sentences` if > 0; the translations
    and their references are returned, for a paired test); the losses
    teacher forced over every pair."""
    model, vocabulary, options = loading.trained(self.model_dir, checkpoint,
                                                 method=decoding)
    pairs = evaluator.dev_pairs(run_dir.load_spec(self.model_dir))
    pairs_translated = pairs[:max_sentences] if max_sentences else pairs
    scores, hypotheses = evaluator.translation_scores(
        evaluator.best_ids_fn(model, options), vocabulary, pairs_translated,
        source_eos=model.config.model.source_eos)
    label_smoothing = run_dir.load_config(
        self.model_dir).training.label_smoothing
    return dict(scores, **evaluator.teacher_forced_losses(
        model, vocabulary, pairs, label_smoothing), hypotheses=hypotheses,
                references=[t for _, t in pairs_translated])


def open_translator(model=None, model_dir=None, ensemble_average="log_probs",
                    shortlist=None, **decoding) -> Translator:
  """A translator over `model` (an export: a SavedModel version or a
  CTranslate2 directory; or a run) or over `model_dir` (a run; a list of
  several runs or checkpoints decodes as their ensemble, combined by
  `ensemble_average`), exactly one of them. `decoding` (DecodingOptions
  fields; None = the config's) and `shortlist` (K, N: `Runner.export`'s)
  apply to a run only: an export's search is fixed. Raises ValueError,
  DataError (no shortlist table)."""
  if bool(model) == bool(model_dir):
    raise ValueError("pass exactly one of model and model_dir")
  if model_path.is_run(model):
    model, model_dir = None, model
  if model:
    given = [name for name, value in dict(decoding, shortlist=shortlist)
             .items() if value is not None]
    if given:
      raise ValueError(f"{', '.join(given)}: the decoding is fixed in an "
                       "export; re-export, or use the run")
    return Translator.from_export(model)
  return Translator.from_module(loading.translation_module(
      model_dir, None, ensemble_average, shortlist=shortlist, **decoding))


def open_scorer(model, alignment=False, alignment_layer=None) -> Scorer:
  """A `Scorer` (log P(target | source), teacher forced; with `alignment`
  each pair's word alignment from decoder layer `alignment_layer`'s
  attention) over `model`: a SavedModel version, a CTranslate2 directory,
  or a run (a directory with config.json, its newest checkpoint). Raises
  FileNotFoundError or ValueError."""
  if model_path.is_run(model):
    return Scorer.from_module(loading.translation_module(model), alignment,
                              alignment_layer)
  return Scorer.from_export(model, alignment, alignment_layer)


def attention(sentence, model=None, model_dir=None) -> dict:
  """One sentence's translation, tokens and attention weights (numpy) from
  an export's `attention` signature (`model`) or the same graph code run on
  a run (`model_dir`, or `model` where it names a run): a teacher-forced
  pass over the best translation."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if bool(model) == bool(model_dir):
    raise ValueError("pass exactly one of --model and --model_dir")
  if model_path.is_run(model):
    model, model_dir = None, model
  if model:
    import tensorflow_text  # noqa: F401  pylint: disable=unused-import,g-import-not-at-top
    function = tf.saved_model.load(model).signatures["attention"]
  else:
    module = loading.translation_module(model_dir)
    function = module.attention  # (the tf.function holds `module` weakly)
  out = function(text=tf.constant([sentence]))
  return {key: value.numpy()[0] for key, value in out.items()}


def translate(translator, texts, nbest=1, batch_size=32, progress=None,
              batch_tokens=0):
  """Each text's `nbest` (translation, score) pairs, best first
  (`Translator.translate` for the batching)."""
  return translator.translate(texts, nbest, batch_size, progress,
                              batch_tokens=batch_tokens)


def evaluate(translator, source_lines, reference_lines, batch_size=32,
             paper_bleu=False, progress=None,
             names=("the source", "the reference"),
             batch_tokens=0) -> Evaluation:
  """Translates `source_lines` and scores them against `reference_lines`
  with sacrebleu (`evaluation.score`): one reference set, or a list of
  several. `names` name the source and each set in messages. Raises
  DataError if the counts differ."""
  sets = evaluation.reference_sets(reference_lines)
  named = list(names[1:]) + [f"reference {i + 1}"
                             for i in range(len(names) - 1, len(sets))]
  for one, name in zip(sets, named):
    corpora.check_line_aligned(source_lines, one, (names[0], name))
  warnings = translator.input_warnings(source_lines, names[0])
  hypotheses = [h[0][0] for h in translate(translator, source_lines, 1,
                                           batch_size, progress,
                                           batch_tokens)]
  return Evaluation(hypotheses, evaluation.score(hypotheses, reference_lines,
                                                 paper_bleu), warnings)


def describe_training(result, train_minutes=None):
  """`Runner.train`'s result as lines for people: how far it trained (or
  why it stopped), the dev metrics and the weights' fingerprint."""
  if result["stopped_by"]:
    saved = (f"saved {result['checkpoint']}" if result["checkpoint"] else
             "nothing trained to save yet")
    return [f"stopped by {result['stopped_by']} at step {result['step']}; "
            f"{saved}; the same command resumes"]
  if result["losses"]:
    lines = [f"trained to step {result['step']}: loss "
             f"{result['losses'][0]:.4f} (first step of this run) -> "
             f"{result['last_logged_loss']:.4f} (the last progress line's)"]
    if result["time_up"]:
      lines.append(f"stopped at the --train_minutes={train_minutes:g} "
                   f"budget: {result['train_minutes']:.1f} minutes trained "
                   f"in all; saved {result['checkpoint']}")
  else:
    spent = (f" ({result['train_minutes']:.1f} minutes)" if result["time_up"]
             else "")
    lines = [f"already trained to step {result['step']}{spent}: nothing to "
             "do"]
  if result.get("stopped_early"):
    lines.append(f"{result['stopped_early']}; saved {result['checkpoint']}")
  if result["dev"]:
    lines.append("dev: " + " ".join(f"{k}={v:.4f}"
                                    for k, v in result["dev"].items()))
  best = result.get("best")
  if best:
    lines.append(f"best dev checkpoint: step {best['step']} (" + " ".join(
        f"{k}={v:.4f}" for k, v in best["metrics"].items())
                 + f"), kept in {best['directory']} (export it with "
                 "--checkpoint=best)")
  return lines + [f"weights_fingerprint={result['weights_fingerprint']:.6f}"]


def _write_text(spec, output_dir, splits):
  """Writes each split's pairs as two line-aligned files; returns them."""
  written = []
  for split in splits:
    paths = [os.path.join(output_dir, f"{split}.{language}") for language in
             (spec.source_language, spec.target_language)]
    pairs = list(sources.text_pairs(spec, split)())
    for side, path in enumerate(paths):
      with open(path, "w", encoding="utf-8") as f:
        f.write("".join(" ".join(pair[side].splitlines()) + "\n"
                        for pair in pairs))
    written += paths
  return written
