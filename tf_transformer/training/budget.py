"""The model and its regularization sized for a time budget: how many
passes over the corpus a run given --train_minutes can make on this host,
and the `small_corpus` size and dropout (section 5.4's P_drop) that suit
that many.

On Multi30k's 29,000 pairs the preset (3 layers, d_model 256) with dropout
0.1 fits best near 17 epochs and overfits after. A budget that buys many
more epochs trains Wu et al.'s (2021) smaller model for this corpus, 4
layers of d_model 128 and d_ff 256, with eq. 3's full rate peaking at step
2,000 and dropout 0.2: on the budget where the preset needs dropout 0.3 not
to overfit, it scores the same on val with a third of the parameters
(docs/recipes.md has the runs). The rule holds where it was measured, a
corpus the size of Multi30k's: on its first 5,000 pairs more dropout lost
4.4 val BLEU over 20 minutes of about 90 epochs, so smaller corpora keep
the preset.

The epochs are planned from a probe of the training step
(`precision.probe_tokens_per_sec`), which times full batches of one length
and no dev evaluations: an upper bound on the run's rate, about a third
above what the runs measured.
"""

import dataclasses
import math

# Planned epochs (at the preset's probed rate) above which `small_corpus`
# trains LONG_RUN_HPARAMS: between the 21 of a 20-minute run on a fast
# host, where the preset with dropout 0.1 won, and the 64 of its 60
# minutes, where it overfits.
LONG_RUN_EPOCHS = 40.0
LONG_RUN_HPARAMS = (
    ("num_layers", 4), ("d_model", 128), ("d_ff", 256), ("num_heads", 4),
    ("d_k", 32), ("d_v", 32), ("learning_rate_scale", 1.0),
    ("warmup_steps", 2000), ("dropout_rate", 0.2))
MIN_PAIRS = 20_000  # below: the preset whatever the epochs
# What runs make of the probe's rate (the module docstring: the probe is
# about a third above them).
RUN_SHARE = 0.75


@dataclasses.dataclass(frozen=True)
class Plan:
  epochs: float  # passes over the training pairs the budget buys
  hparams: str  # --hparams overrides to add; "" for the preset's own
  reason: str  # one line for the log


def long_run_hparams():
  """LONG_RUN_HPARAMS as --hparams text."""
  return ",".join(f"{name}={value}" for name, value in LONG_RUN_HPARAMS)


def planned_epochs(tokens_per_sec, minutes, stats, train_steps, batch_tokens):
  """Passes over the training pairs that `minutes` buy, or `train_steps`
  where they end the run first.

  Args:
    tokens_per_sec: source plus target tokens a second of training.
    minutes: the time budget (--train_minutes).
    stats: the run's corpus statistics (data_stats.json): "train" with
      "source_tokens" and "target_tokens" ("pairs" too for `plan`).
    train_steps: the run's step budget.
    batch_tokens: tokens a side of a batch (at most).
  Returns:
    The epochs, a float.
  """
  per_epoch = max(1, stats["train"]["source_tokens"]
                  + stats["train"]["target_tokens"])
  return min(tokens_per_sec * minutes * 60,
             train_steps * 2 * batch_tokens) / per_epoch


def plan(tokens_per_sec, minutes, stats, config):
  """The model and dropout for a run of `minutes` on this host.

  Args:
    tokens_per_sec, minutes, stats: as `planned_epochs`'s.
    config: the run's TransformerConfig (its steps, batch and dropout).
  Returns:
    A Plan: LONG_RUN_HPARAMS above LONG_RUN_EPOCHS planned epochs of a
    corpus of MIN_PAIRS or more, else the preset's (hparams "").
  """
  t = config.training
  epochs = planned_epochs(tokens_per_sec, minutes, stats, t.train_steps,
                          t.batch_tokens)
  preset_dropout = config.model.dropout_rate
  measured = (f"{minutes:g} minutes at the probe's {tokens_per_sec:,.0f} "
              f"tokens/s (or {t.train_steps:,} steps) are at most "
              f"{epochs:.0f} epochs")
  pairs = stats["train"]["pairs"]
  preset = (f"the preset's model with dropout {preset_dropout}: "
            f"{measured}")
  if pairs < MIN_PAIRS:
    return Plan(epochs, "", (
        f"{preset}, but of {pairs:,} training pairs, fewer than the "
        f"{MIN_PAIRS:,} where the long-run model gains"))
  if epochs > LONG_RUN_EPOCHS:
    return Plan(epochs, long_run_hparams(), (
        f"the long-run model ({long_run_hparams()}): {measured}, over the "
        f"{LONG_RUN_EPOCHS:.0f} where the preset with dropout "
        f"{preset_dropout} overfits"))
  return Plan(epochs, "", f"{preset}, not over {LONG_RUN_EPOCHS:.0f}")


def against_shown(epochs, minutes, shown):
  """One line for the job's start: the epochs `minutes` buy on this host
  (`epochs`: `planned_epochs` from the probe) against those of the run
  README.md shows (`shown`, a `tasks.Shown`), and the flags that train as
  far as it did here: its steps, with minutes a quarter over what they
  take here (the run stops at the steps)."""
  here = epochs * RUN_SHARE
  needed = minutes * shown.epochs / max(here, 1e-9)
  return (f"{minutes:g} minutes buy about {here:.1f} epochs on this host "
          f"({RUN_SHARE:.0%} of the probe's {epochs:.1f}: what runs make of "
          f"it); README.md's model trained {shown.epochs:.1f} epochs "
          f"({shown.steps:,} steps) in {shown.minutes:g} minutes on "
          f"{shown.host}. To train as far here: --train_steps={shown.steps} "
          f"--train_minutes={math.ceil(1.25 * needed)}")
