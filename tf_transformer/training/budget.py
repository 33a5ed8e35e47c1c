"""Regularization sized for a time budget: how many passes over the
corpus a run given --train_minutes can make on this host, and the
`small_corpus` dropout (section 5.4's P_drop) that suits that many.

On Multi30k's 29,000 pairs the preset's dropout 0.1 fits best near 17
epochs and overfits after; dropout 0.3 (Wu et al., 2021, for this corpus)
learns more slowly and keeps improving for 50 epochs and more
(docs/recipes.md has the runs). So a budget that buys many epochs trains
with 0.3, a short one with 0.1. The rule holds where it was measured, a
corpus the size of Multi30k's: on its first 5,000 pairs dropout 0.3 lost
4.4 val BLEU over 20 minutes of about 90 epochs, learning too slowly to
gain from the longer run, so smaller corpora keep the preset's.

The epochs are planned from a probe of the training step
(`precision.probe_tokens_per_sec`), which times full batches of one length
and no dev evaluations: an upper bound on the run's rate, about a third
above what the runs measured.
"""

import dataclasses
from typing import Optional

# Planned epochs (at the probe's rate) above which `small_corpus` trains
# with LONG_RUN_DROPOUT: between the 21 of a 20-minute run on a fast host,
# where 0.1 won, and the 64 of its 60 minutes, where 0.3 did.
LONG_RUN_EPOCHS = 40.0
LONG_RUN_DROPOUT = 0.3
MIN_PAIRS = 20_000  # below: the preset's dropout whatever the epochs


@dataclasses.dataclass(frozen=True)
class Plan:
  epochs: float  # passes over the training pairs the budget buys
  dropout_rate: Optional[float]  # None: the preset's own
  reason: str  # one line for the log


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
  """The dropout for a run of `minutes` on this host.

  Args:
    tokens_per_sec, minutes, stats: as `planned_epochs`'s.
    config: the run's TransformerConfig (its steps, batch and dropout).
  Returns:
    A Plan: LONG_RUN_DROPOUT above LONG_RUN_EPOCHS planned epochs of a
    corpus of MIN_PAIRS or more, else the preset's (dropout_rate None).
  """
  t = config.training
  epochs = planned_epochs(tokens_per_sec, minutes, stats, t.train_steps,
                          t.batch_tokens)
  preset_dropout = config.model.dropout_rate
  measured = (f"{minutes:g} minutes at the probe's {tokens_per_sec:,.0f} "
              f"tokens/s (or {t.train_steps:,} steps) are at most "
              f"{epochs:.0f} epochs")
  pairs = stats["train"]["pairs"]
  if pairs < MIN_PAIRS:
    return Plan(epochs, None, (
        f"dropout {preset_dropout} (the preset's): {measured}, but of "
        f"{pairs:,} training pairs, fewer than the {MIN_PAIRS:,} that "
        f"{LONG_RUN_DROPOUT} needs to gain"))
  if epochs > LONG_RUN_EPOCHS:
    return Plan(epochs, LONG_RUN_DROPOUT, (
        f"dropout {LONG_RUN_DROPOUT}: {measured}, over the "
        f"{LONG_RUN_EPOCHS:.0f} where the preset's {preset_dropout} "
        "overfits"))
  return Plan(epochs, None, (
      f"dropout {preset_dropout} (the preset's): {measured}, not over "
      f"{LONG_RUN_EPOCHS:.0f}"))
