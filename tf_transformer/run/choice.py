"""Which model the main job exports: section 6.1's average of the last
checkpoints, unless dev shows another candidate better beyond chance.

The candidates are the average of the last checkpoints (first), the run's
best checkpoint by dev and, where the run trained on past that best, the
average of the checkpoints up to it, all scored on dev alike. Dev BLEU of
greedy translations of about a thousand sentences moves by a point or so
between checkpoints of one quality, so the highest score alone is a noisy
choice (docs/recipes.md has a best checkpoint that led the average by 0.1
and scored lower on test). The candidate with the highest dev metric
replaces the average only where a paired test on the same dev sentences
(`evaluation.paired_p_value`) puts its lead beyond chance; by the `loss`
metric the lowest dev loss is taken.
"""

from typing import NamedTuple, Sequence

from tf_transformer import evaluation
from tf_transformer.training import best as best_lib

# A lead counts where a paired test gives a p-value below this.
SIGNIFICANCE = 0.05


class Candidate(NamedTuple):
  """A model to export: `name` for people, `source` ({"model_dir",
  "checkpoint"}) for the export, `dev` its dev scores: the metric's key,
  "loss" and, for a paired test, "hypotheses" and "references"."""
  name: str
  source: dict
  dev: dict


def choose(candidates: Sequence[Candidate], metric: str):
  """(the candidate to export, the reason in words).

  Args:
    candidates: the average of the last checkpoints first, then others.
    metric: "bleu", "exact_match" (higher is better) or "loss".

  Returns:
    (Candidate, str): the first candidate, unless another has a higher dev
    `metric` (a lower dev loss for "loss") and, for BLEU and exact match,
    the one with the highest has a lead over it that a paired test on the
    dev translations puts below `SIGNIFICANCE`.
  """
  key, higher_is_better = best_lib.METRICS[metric]
  name = best_lib.METRIC_NAMES[metric]
  sign = 1 if higher_is_better else -1
  average = candidates[0]
  # max() keeps the first of equal values: a tie keeps the average.
  leader = max(candidates, key=lambda c: sign * c.dev[key])
  highest = f"the {'highest' if higher_is_better else 'lowest'} dev {name}"
  if leader is average and any(c.dev[key] == average.dev[key]
                               for c in candidates[1:]):
    return leader, f"{highest}, tied: a tie keeps section 6.1's average"
  if leader is average or metric == "loss":
    return leader, highest
  lead = leader.dev[key] - average.dev[key]
  p = evaluation.paired_p_value(
      metric, average.dev["hypotheses"], leader.dev["hypotheses"],
      average.dev["references"])
  test = f"{evaluation.PAIRED_TESTS[metric]}, p = {p:.2g}"
  if p < SIGNIFICANCE:
    return leader, (f"{highest}, {lead:+.4g} over the average, beyond "
                    f"chance ({test})")
  return average, (f"section 6.1's average: a lead of {lead:+.4g} dev "
                   f"{name} is within chance ({test})")
