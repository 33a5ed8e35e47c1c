"""Stopping a run whose loss diverges while it stays finite.

A NaN or Inf stops training at once (`trainer.NonFiniteLossError`), but a
learning rate far too high can drive the loss from 7 to 1e9 and keep it
finite: the run would go on to its last step and checkpoint garbage. The
rule here, after the warm-up of section 5.3 as much as before it: the run
has diverged when the mean loss of the last `window` steps exceeds `factor`
times the lowest such mean so far (from step 1 on, over the steps there were
when fewer than `window`, so that a run that blows up at once is caught
too). Means, not single steps: one easy batch with a very low loss (without
label smoothing a loss can near 0) does not make the next ordinary window
look like a rise. A healthy run's window mean never climbs to 10 times one
it has reached, so the default of 10 over 100 steps stops only runaway
runs. `factor=0` turns the check off. After a resume the window and the
lowest mean start again.
"""

import collections
from typing import Optional


class DivergenceMonitor:
  """Watches each step's loss; `update` says when the run has diverged."""

  def __init__(self, factor=10.0, window=100):
    if factor and factor <= 1.0:
      raise ValueError(f"divergence_factor={factor}: expected 0 (off) or "
                       "a factor above 1")
    if window < 1:
      raise ValueError(f"divergence_window={window}: expected >= 1")
    self.factor = factor
    self.losses = collections.deque(maxlen=window)
    self.lowest, self.lowest_step = float("inf"), None

  def update(self, step, loss) -> Optional[str]:
    """Records `loss` of `step`; returns what diverged, or None."""
    if not self.factor:
      return None
    self.losses.append(loss)
    mean = sum(self.losses) / len(self.losses)
    if mean < self.lowest:
      self.lowest, self.lowest_step = mean, step
    if len(self.losses) < self.losses.maxlen or (
        mean <= self.factor * self.lowest):
      return None
    return (f"the mean loss of the last {len(self.losses)} steps, {mean:.4g}, "
            f"is over {self.factor:g} times the lowest such mean, "
            f"{self.lowest:.4g} at step {self.lowest_step} "
            "(--divergence_factor, --divergence_window)")
