#!/usr/bin/env python3
r"""Trains a Transformer (section 5) on one device, all GPUs of a machine, or
several machines.

  bin/train.py --config=tiny --dataset=numbers --model_dir=/tmp/numbers \
      --train_steps=200 --distribution=mirrored --cpu_devices=8

The run's config, data spec, flags and vocabulary are written into
--model_dir; the same command resumes a killed run from its last checkpoint.
SIGTERM or Ctrl-C saves a checkpoint at the next step boundary and exits.

Exit status: 0 trained; 1 bad flags or hparams; 2 bad data (one line naming
the file and line); 3 NaN or Inf (names the last good checkpoint); 4 another
run holds --model_dir; 143 / 130 stopped by SIGTERM / SIGINT, checkpoint
saved (the same command resumes).
"""

import contextlib
import os
import signal
import sys

from absl import flags
from absl import logging

from tf_transformer import command
from tf_transformer import config as config_lib
from tf_transformer.data import data_flags
from tf_transformer.data import prepare as prepare_lib
from tf_transformer.data import vocabulary as vocabulary_lib
from tf_transformer.data.errors import DataError
from tf_transformer.training import interruption
from tf_transformer.run import run_dir
from tf_transformer.training import run_lock
from tf_transformer.training import strategy as strategy_lib

FLAGS = flags.FLAGS
data_flags.define_flags()
flags.DEFINE_enum("config", "base", sorted(config_lib.PRESETS),
                  "Model preset: base, big, Table 3 rows, parsing, tiny.")
flags.DEFINE_string("hparams", "", "Config overrides, e.g. "
                    "'dropout_rate=0.2,warmup_steps=8000'.")
flags.DEFINE_string("model_dir", None, "Checkpoints, summaries and the run's "
                    "config and vocabulary.")
flags.DEFINE_integer("train_steps", None, "Optimizer updates (default: the "
                     "preset's, 100k for base, 300k for big).")
flags.DEFINE_float("train_minutes", None, "Stop after this many minutes of "
                   "training (counted over resumes; --train_steps still "
                   "bounds it), with a checkpoint.")
flags.DEFINE_integer("batch_tokens", None, "Tokens per side in a global batch "
                     "(default: the preset's, 25000 as in the paper).")
flags.DEFINE_enum("distribution", "one_device", list(strategy_lib.DISTRIBUTIONS),
                  "tf.distribute strategy.")
flags.DEFINE_integer("num_gpus", None, "GPUs to use (default: all visible).")
flags.DEFINE_integer("cpu_devices", 0, "Split the CPU into N logical devices "
                     "(MirroredStrategy without GPUs).")
flags.DEFINE_string("tpu", None, "TPU name or address for --distribution=tpu.")
flags.DEFINE_bool("xla_attention", True, "Run the attention core under XLA.")
flags.DEFINE_bool("xla_loss", True, "Run the label-smoothed loss and its "
                  "gradient under XLA (a few fused passes over the logits).")
flags.DEFINE_bool("jit_compile_step", False, "Compile each replica's whole "
                  "training step with XLA (one device, or GPUs).")
flags.DEFINE_enum("mixed_precision", "", ["", "bfloat16", "float16"],
                  "Mixed precision; float16 uses dynamic loss scaling.")
flags.DEFINE_integer("gradient_accumulation_steps", 1, "Micro-batches per "
                     "update, to reach the paper's batch on less hardware.")
flags.DEFINE_integer("checkpoint_every_secs", 600, "Checkpoint period in "
                     "seconds (paper: 10 minutes); 0 turns it off.")
flags.DEFINE_integer("checkpoint_every_steps", None, "Checkpoint period in "
                     "steps.")
flags.DEFINE_integer("keep_checkpoints", 20, "Checkpoints kept.")
flags.DEFINE_integer("average_checkpoints", 5, "How many checkpoints this run "
                     "will average (paper: 5 base, 20 big); "
                     "--keep_checkpoints may not be below it.")
flags.DEFINE_integer("eval_every_steps", 1000, "Dev loss, BLEU and samples "
                     "period; 0 turns it off.")
flags.DEFINE_integer("eval_max_sentences", 200, "Dev sentences translated for "
                     "BLEU at each evaluation.")
flags.DEFINE_integer("log_every_steps", 100, "Progress line period.")
flags.DEFINE_bool("log_gradient_norm", True, "Measure the aggregated gradient "
                  "norm (one more all-reduce per step with several devices).")
flags.DEFINE_integer("vocab_size", None, "Shared source-target vocabulary "
                     "size (default: follows the training pairs: 4000 "
                     "below 10k, 8000 below 100k, 16000 below 1M, else the "
                     "paper's 37000); smaller when the corpus cannot fill "
                     "it.")
flags.DEFINE_enum("vocab_model_type", "bpe", ["bpe", "unigram"],
                  "SentencePiece model type.")
flags.DEFINE_integer("seed", 0, "Seed of initialization, dropout and data "
                     "order.")
flags.DEFINE_bool("allow_recipe_change", False, "Resume --model_dir with "
                  "other training hparams (learning rate, warm-up, dropout, "
                  "label smoothing, batch), keeping the weights; the "
                  "architecture must stay the same.")
flags.DEFINE_bool("ignore_run_lock", False, "Train even though another live "
                  "run holds --model_dir's lock (only if you know it writes "
                  "elsewhere).")
flags.mark_flag_as_required("model_dir")
flags.register_validator("keep_checkpoints", lambda v: v >= 1,
                         "--keep_checkpoints must be >= 1")


def _run_config():
  config = config_lib.get_config(FLAGS.config, FLAGS.hparams,
                                 xla_attention=FLAGS.xla_attention)
  if FLAGS.train_steps:
    config = config.replace(train_steps=FLAGS.train_steps)
  if FLAGS.batch_tokens:
    config = config.replace(batch_tokens=FLAGS.batch_tokens)
  return config


def _prepare_run_dir(config, spec, chief):
  """Returns (config, vocabulary): the saved ones when resuming."""
  model_dir = FLAGS.model_dir
  if not chief:
    run_dir.wait_for(model_dir)
  if os.path.exists(os.path.join(model_dir, run_dir.CONFIG)):
    return _resumed_config(config, model_dir, chief)
  if os.path.exists(os.path.join(model_dir, vocabulary_lib.FILENAME)):
    # From bin/prepare_data.py --output_dir=MODEL_DIR, say.
    logging.info("using the vocabulary already in %s", model_dir)
    vocabulary = vocabulary_lib.Vocabulary.load(model_dir)
  else:
    logging.info("building the vocabulary from the training data")
    vocabulary = prepare_lib.build_vocabulary(
        spec, FLAGS.vocab_size, FLAGS.vocab_model_type, seed=FLAGS.seed)
    vocabulary.save(model_dir)
  config = config.replace(vocab_size=vocabulary.vocab_size)
  stats = prepare_lib.corpus_statistics(spec, vocabulary, FLAGS.max_length)
  for split, split_stats in stats.items():
    if isinstance(split_stats, dict):
      logging.info(
          "%s: %d pairs, %d dropped as longer than --max_length=%d, %d with "
          "an empty side", split, split_stats["pairs"],
          split_stats["dropped_too_long"], FLAGS.max_length,
          split_stats["dropped_empty_side"])
  run_dir.save(model_dir, config, spec, FLAGS.flags_into_string(), stats)
  return config, vocabulary


def _resumed_config(config, model_dir, chief):
  """The saved run's config, with the asked runtime (and, if allowed,
  training recipe) fields."""
  saved = run_dir.load_config(model_dir)
  asked = config.replace(vocab_size=saved.vocab_size).to_dict()
  may_change = {"xla_attention", "train_steps"}
  if FLAGS.allow_recipe_change:
    may_change |= set(asked) - set(config_lib.ARCHITECTURE_FIELDS)
  changed = {k: (v, asked[k]) for k, v in saved.to_dict().items()
             if asked[k] != v}  # (saved, asked)
  diff = {k: v for k, v in changed.items() if k not in may_change}
  if diff:
    fix = ("" if FLAGS.allow_recipe_change else
           "; to change only the training recipe and keep the weights, add "
           "--allow_recipe_change")
    raise ValueError(
        f"--model_dir={model_dir} holds a run with other hparams (saved, "
        f"asked): {diff}: resume with the same flags or use a new "
        f"--model_dir{fix}")
  resumed = saved.replace(**{k: asked[k] for k in may_change})
  if FLAGS.allow_recipe_change and resumed != saved and chief:
    logging.info("--allow_recipe_change: resuming with %s (was, now)",
                 changed)
    run_dir.save(model_dir, resumed, flags_text=FLAGS.flags_into_string())
  return resumed, vocabulary_lib.Vocabulary.load(model_dir)


def main(argv):
  del argv
  stop = interruption.StopRequest().install()
  if FLAGS.keep_checkpoints < FLAGS.average_checkpoints:
    return _fail(
        f"error: --keep_checkpoints={FLAGS.keep_checkpoints} is below "
        f"--average_checkpoints={FLAGS.average_checkpoints}: the checkpoints "
        "to average would be deleted", 1)
  if FLAGS.distribution == "multi_worker" and (
      FLAGS.checkpoint_every_secs or not FLAGS.checkpoint_every_steps):
    return _fail(
        "error: --distribution=multi_worker saves checkpoints collectively, "
        "so every worker must decide alike: pass --checkpoint_every_steps=N "
        "and --checkpoint_every_secs=0", 1)
  strategy_lib.split_cpu(FLAGS.cpu_devices)  # before any op
  from tf_transformer.training.trainer import NonFiniteLossError  # pylint: disable=g-import-not-at-top
  try:
    config = _run_config()
    spec = data_flags.spec_from_flags()
    # Before anything runs an op: collective ops are configured at start-up.
    strategy = strategy_lib.create_strategy(
        FLAGS.distribution, FLAGS.num_gpus, FLAGS.cpu_devices, FLAGS.tpu)
    stop.install()  # again: MultiWorker's coordination agent took SIGTERM
    chief = strategy_lib.is_chief(strategy)
    lock = run_lock.RunLock(FLAGS.model_dir, FLAGS.ignore_run_lock) if chief \
        else contextlib.nullcontext()
    with lock:
      result = _train(config, spec, strategy, chief, stop)
  except DataError as e:
    return _fail(f"error: {e}", 2)
  except (ValueError, FileNotFoundError) as e:
    return _fail(f"error: {e}", 1)
  except NonFiniteLossError as e:
    return _fail(str(e), 3)
  except run_lock.RunLockedError as e:
    return _fail(f"error: {e}", 4)
  except KeyboardInterrupt:
    return _fail("stopped at once by a second Ctrl-C, unsaved; the same "
                 "command resumes from the last checkpoint", 130)
  if result["stopped_by"]:
    saved = (f"saved {result['checkpoint']}" if result["checkpoint"] else
             "nothing trained to save yet")
    print(f"stopped by {result['stopped_by']} at step {result['step']}; "
          f"{saved}; the same command resumes")
    return stop.exit_status or 128 + signal.SIGTERM  # another worker's
  losses = result["losses"]
  if losses:
    print(f"trained to step {result['step']}: loss {losses[0]:.4f} (first "
          f"step of this run) -> {result['last_logged_loss']:.4f} (the last "
          "progress line's)")
    if result["time_up"]:
      print(f"stopped at the --train_minutes={FLAGS.train_minutes:g} budget: "
            f"{result['train_minutes']:.1f} minutes trained in all; saved "
            f"{result['checkpoint']}")
  else:
    spent = (f" ({result['train_minutes']:.1f} minutes)" if result["time_up"]
             else "")
    print(f"already trained to step {result['step']}{spent}: nothing to do")
  if result["dev"]:
    print("dev: " + " ".join(f"{k}={v:.4f}" for k, v in result["dev"].items()))
  print(f"weights_fingerprint={result['weights_fingerprint']:.6f}")
  return 0


def _train(config, spec, strategy, chief, stop):
  from tf_transformer.training.trainer import TrainOptions  # pylint: disable=g-import-not-at-top
  from tf_transformer.training.trainer import Trainer  # pylint: disable=g-import-not-at-top
  config, vocabulary = _prepare_run_dir(config, spec, chief)
  options = TrainOptions(
      model_dir=FLAGS.model_dir, train_steps=config.train_steps,
      batch_tokens=config.batch_tokens, max_length=FLAGS.max_length,
      gradient_accumulation_steps=FLAGS.gradient_accumulation_steps,
      checkpoint_every_steps=FLAGS.checkpoint_every_steps,
      checkpoint_every_secs=FLAGS.checkpoint_every_secs,
      keep_checkpoints=FLAGS.keep_checkpoints,
      eval_every_steps=FLAGS.eval_every_steps,
      eval_max_sentences=FLAGS.eval_max_sentences,
      log_every_steps=FLAGS.log_every_steps, seed=FLAGS.seed,
      jit_compile_step=FLAGS.jit_compile_step, xla_loss=FLAGS.xla_loss,
      mixed_precision=FLAGS.mixed_precision or None,
      log_gradient_norm=FLAGS.log_gradient_norm,
      train_minutes=FLAGS.train_minutes)
  logging.info("%s on %d replica(s), whole-step XLA %s: %s",
               FLAGS.distribution, strategy.num_replicas_in_sync,
               "on" if options.jit_compile_step else "off", config)
  return Trainer(config, vocabulary, spec, options, strategy).train(stop)


def _fail(message, status):
  print(f"train: {message}", file=sys.stderr)
  return status


if __name__ == "__main__":
  command.run(main)
