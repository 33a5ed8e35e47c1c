"""absl flags of bin/train.py, and the `Runner.train` arguments they mean."""

from absl import flags

from tf_transformer import config as config_lib
from tf_transformer.choices import DISTRIBUTIONS
from tf_transformer.data import data_flags

# Flags that are TrainOptions fields of the same name.
TRAIN_OPTIONS = ("max_length", "gradient_accumulation_steps",
                 "checkpoint_every_steps", "checkpoint_every_secs",
                 "keep_checkpoints", "eval_every_steps", "eval_max_sentences",
                 "log_every_steps", "seed",
                 "xla_loss",
                 "log_gradient_norm", "train_minutes", "divergence_factor",
                 "divergence_window", "eval_decoding", "best_metric",
                 "early_stopping", "early_stopping_min_delta")


# --xla_attention: TrainOptions.xla_attention.
XLA_ATTENTION = {"auto": None, "on": True, "off": False}


def define_flags():
  """The data flags and the training flags."""
  data_flags.define_flags()
  flags.DEFINE_enum("config", "auto", ["auto"] + sorted(config_lib.PRESETS),
                    "Model preset: base, big, Table 3 rows, parsing, "
                    "small_corpus, tiny; auto: by the training pairs "
                    "(small_corpus below 1M pairs, base above), logged with "
                    "the reason.")
  flags.DEFINE_string("hparams", "", "Config overrides, e.g. "
                      "'dropout_rate=0.2,warmup_steps=8000'.")
  flags.DEFINE_string("model_dir", None, "Checkpoints, summaries and the run's "
                      "config and vocabulary.")
  flags.DEFINE_integer("train_steps", None, "Optimizer updates (default: the "
                       "preset's, 100k for base, 300k for big).")
  flags.DEFINE_float("train_minutes", None, "Stop after this many minutes of "
                     "training (counted over resumes; --train_steps still "
                     "bounds it), with a checkpoint.")
  flags.DEFINE_float("divergence_factor", 10.0, "Stop (exit 3, like a "
                     "NaN) when the mean loss of the last "
                     "--divergence_window steps exceeds this many times the "
                     "lowest such mean so far; 0: never.", lower_bound=0.0)
  flags.DEFINE_integer("divergence_window", 100, "Steps averaged for "
                       "--divergence_factor.", lower_bound=1)
  flags.DEFINE_integer("batch_tokens", None, "Tokens per side in a global "
                       "batch (default: the preset's; 25000 for base and "
                       "big, as in the paper; 4096 for small_corpus).")
  flags.DEFINE_enum("distribution", "one_device",
                    list(DISTRIBUTIONS),
                    "tf.distribute strategy.")
  flags.DEFINE_integer("num_gpus", None, "GPUs to use (default: all visible).")
  flags.DEFINE_integer("cpu_devices", 0, "Split the CPU into N logical devices "
                       "(MirroredStrategy without GPUs).")
  flags.DEFINE_bool("xla_loss", True, "Run the label-smoothed loss and its "
                    "gradient under XLA (a few fused passes over the logits).")
  flags.DEFINE_enum("xla_attention", "auto", ["auto", "on", "off"],
                    "Run the attention core (eq. 1) of the training step "
                    "and its gradient under XLA, one program per batch "
                    "shape (each length's batches filled to one shape); "
                    "auto: on where TensorFlow sees a GPU, off on CPUs.")
  flags.DEFINE_enum("mixed_precision", "",
                    ["", "auto", "float32", "bfloat16", "float16"],
                    "Mixed precision; float16 uses dynamic loss scaling; "
                    "auto: with GPUs, bfloat16 on compute capability 8.0 "
                    "and later, float16 before; on CPUs, bfloat16 where the "
                    "CPU has AVX512_BF16 or AMX and a probe of the step "
                    "finds it faster, else float32; chosen once and kept on "
                    "resume (docs/training.md). "
                    "Default: auto with --config=auto, else float32.")
  flags.DEFINE_integer("gradient_accumulation_steps", 1, "Micro-batches per "
                       "update, to reach the paper's batch on less hardware.")
  flags.DEFINE_integer("checkpoint_every_secs", 600, "Checkpoint period in "
                       "seconds (paper: 10 minutes); 0 turns it off.")
  flags.DEFINE_integer("checkpoint_every_steps", None, "Checkpoint period in "
                       "steps.")
  flags.DEFINE_integer("keep_checkpoints", 20, "Checkpoints kept.")
  flags.DEFINE_integer("average_checkpoints", 5, "How many checkpoints this "
                       "run "
                       "will average (paper: 5 base, 20 big); "
                       "--keep_checkpoints may not be below it.")
  flags.DEFINE_integer("eval_every_steps", 1000, "Dev loss, BLEU and samples "
                       "period; 0 turns it off.")
  flags.DEFINE_integer("eval_max_sentences", 0, "Translate only the first "
                       "N dev sentences for dev BLEU; 0: the whole dev set "
                       "(batched by tokens).", lower_bound=0)
  flags.DEFINE_enum("eval_decoding", "greedy", ["greedy", "beam"],
                    "The search that translates dev for BLEU: greedy, or "
                    "the config's beam search (what the export will do; "
                    "slower).")
  flags.DEFINE_enum("best_metric", None, ["bleu", "exact_match", "loss"],
                    "Keep the checkpoint with the best dev BLEU, exact "
                    "match or the lowest dev loss (equal values: the lower "
                    "dev loss) in MODEL_DIR/best/, apart from the rolling "
                    "--keep_checkpoints; bin/export.py --checkpoint=best "
                    "exports it. Default: exact_match for "
                    "--dataset=numbers (one-word outputs: BLEU is 0), bleu "
                    "otherwise.")
  flags.DEFINE_integer("early_stopping", 0, "Stop after this many dev "
                       "evaluations in a row without an improvement of "
                       "--best_metric by --early_stopping_min_delta; 0: "
                       "never.", lower_bound=0)
  flags.DEFINE_float("early_stopping_min_delta", 0.0, "The smallest change "
                     "of --best_metric (BLEU points, exact match, or loss) that counts "
                     "as an improvement for --early_stopping.",
                     lower_bound=0.0)
  flags.DEFINE_integer("log_every_steps", 100, "Progress line period.")
  flags.DEFINE_bool("log_gradient_norm", True, "Measure the aggregated "
                    "gradient "
                    "norm (one more all-reduce per step with several devices).")
  data_flags.define_vocabulary_flags()
  flags.DEFINE_integer("seed", 0, "Seed of initialization, dropout and data "
                       "order.")
  flags.DEFINE_bool("allow_recipe_change", False, "Resume --model_dir with "
                    "other training hparams (learning rate, warm-up, dropout, "
                    "label smoothing, batch), keeping the weights; the "
                    "architecture must stay the same.")
  flags.DEFINE_string("init_from", None, "Fine-tune: start a new run from "
                      "another run's model weights (a model directory, its "
                      "newest checkpoint; RUN/best; or a checkpoint path), "
                      "with its vocabulary and architecture (--config and "
                      "--hparams default to its config) and a fresh "
                      "optimizer, step and schedule.")
  flags.DEFINE_bool("allow_data_change", False, "Resume --model_dir on other "
                    "training data than it was trained on, keeping its "
                    "optimizer state and step (to start afresh on new data "
                    "from its weights, use --init_from in a new "
                    "--model_dir).")
  flags.DEFINE_bool("ignore_run_lock", False, "Train even though another live "
                    "run holds --model_dir's lock (only if you know it writes "
                    "elsewhere).")
  flags.mark_flag_as_required("model_dir")
  flags.register_validator("keep_checkpoints", lambda v: v >= 1,
                           "--keep_checkpoints must be >= 1")


def config_from_flags(values=None):
  """The preset with --hparams, --train_steps and --batch_tokens applied; for --config=auto a `config.AutoConfig`, which
  the run resolves by its training pairs."""
  from tf_transformer.run import run_dir  # pylint: disable=g-import-not-at-top
  values = values or flags.FLAGS
  if values.init_from and values.config == "auto":
    # Fine-tuning: the other run's config, with --hparams on top.
    theirs = run_dir.load_config(run_dir.run_and_checkpoint(
        values.init_from)[0]).flat()
    config = config_lib.TransformerConfig.from_flat({
        **theirs, **config_lib.parse_overrides(values.hparams)})
  else:
    changes = {}
    if values.train_steps:
      changes["train_steps"] = values.train_steps
    if values.batch_tokens:
      changes["batch_tokens"] = values.batch_tokens
    if values.config == "auto":  # chosen once the pairs are counted
      return config_lib.AutoConfig(values.hparams, tuple(changes.items()))
    return config_lib.get_config(values.config, values.hparams, **changes)
  if values.train_steps:
    config = config.replace(train_steps=values.train_steps)
  if values.batch_tokens:
    config = config.replace(batch_tokens=values.batch_tokens)
  return config


def train_arguments(values=None) -> dict:
  """`Runner.train` keyword arguments from the flags (all but config,
  spec, strategy and stop)."""
  from tf_transformer.training import precision  # pylint: disable=g-import-not-at-top
  values = values or flags.FLAGS
  return dict(
      vocab_size=values.vocab_size, vocab_model_type=values.vocab_model_type,
      allow_recipe_change=values.allow_recipe_change,
      init_from=values.init_from,
      xla_attention=XLA_ATTENTION[values.xla_attention],
      allow_data_change=values.allow_data_change,
      ignore_run_lock=values.ignore_run_lock,
      flags_text=values.flags_into_string(),
      mixed_precision=values.mixed_precision or (
          precision.AUTO if values.config == "auto" else None),
      **{name: values[name].value for name in TRAIN_OPTIONS})


def flag_errors(values=None):
  """What the flags ask that cannot work together, as messages."""
  values = values or flags.FLAGS
  errors = []
  if values.keep_checkpoints < values.average_checkpoints:
    errors.append(
        f"--keep_checkpoints={values.keep_checkpoints} is below "
        f"--average_checkpoints={values.average_checkpoints}: the "
        "checkpoints to average would be deleted")
  if values.early_stopping and not values.eval_every_steps:
    errors.append(
        f"--early_stopping={values.early_stopping} counts dev evaluations: "
        "it needs --eval_every_steps > 0")
  if values.distribution == "multi_worker" and (
      values.checkpoint_every_secs or not values.checkpoint_every_steps):
    errors.append(
        "--distribution=multi_worker saves checkpoints collectively, so "
        "every worker must decide alike: pass --checkpoint_every_steps=N "
        "and --checkpoint_every_secs=0")
  return errors
