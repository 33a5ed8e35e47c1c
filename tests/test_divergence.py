"""The divergence rule (training/divergence.py) on loss curves: a healthy,
noisy curve never trips it, nor one low outlier; a runaway one does, once
its window is full."""

import numpy as np
import pytest

from tf_transformer.training.divergence import DivergenceMonitor


def _first_trip(monitor, losses):
  for step, loss in enumerate(losses, 1):
    if monitor.update(step, loss):
      return step
  return None


def test_a_noisy_healthy_curve_never_trips():
  rng = np.random.default_rng(0)
  # 9 -> 2 over 5,000 steps, batches varying by +-40%, a warm-up bump.
  steps = np.arange(5000)
  curve = 2.0 + 7.0 * np.exp(-steps / 800) + 0.5 * np.exp(
      -((steps - 300) / 100) ** 2)
  losses = curve * rng.uniform(0.6, 1.4, size=steps.shape)
  assert _first_trip(DivergenceMonitor(), losses) is None


def test_one_very_easy_batch_is_not_a_baseline():
  """Without label smoothing a batch's loss can near 0: the next windows of
  ordinary losses are no rise."""
  rng = np.random.default_rng(1)
  losses = list(rng.uniform(0.3, 0.9, size=300))
  losses[150] = 0.01
  assert _first_trip(DivergenceMonitor(factor=10, window=100),
                     losses) is None


def test_a_runaway_curve_trips_once_the_window_is_full():
  losses = [7.2, 6.9, 6.5] + [10.0 ** min(9, n) for n in range(1, 200)]
  monitor = DivergenceMonitor(factor=10, window=20)
  step = _first_trip(monitor, losses)
  # The first full 20-step window's mean is far over 10 x the lowest mean,
  # that of steps 1-3.
  assert step == 20
  assert monitor.lowest == pytest.approx((7.2 + 6.9 + 6.5) / 3)
  assert monitor.lowest_step == 3


def test_factor_zero_is_off_and_bad_settings_are_refused():
  assert _first_trip(DivergenceMonitor(factor=0), [1.0] + [1e9] * 500) is None
  with pytest.raises(ValueError, match="divergence_factor=0.5"):
    DivergenceMonitor(factor=0.5)
  with pytest.raises(ValueError, match="divergence_window=0"):
    DivergenceMonitor(window=0)
