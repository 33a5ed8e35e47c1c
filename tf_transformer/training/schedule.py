"""The learning rate of section 5.3, eq. 3:

    lrate = d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)

rising linearly for `warmup_steps` steps, then decaying with the inverse
square root of the step. At step 0 the min is 0 (no division by zero).

`TrainingConfig.learning_rate_schedule="budget"` keeps eq. 3's warm-up and
then decays linearly to zero at a horizon, the last step the run's budget
allows (Li, Yumer & Ramanan, "Budgeted Training", ICLR 2020: a schedule
that reaches zero at the budget's end beats one cut off at every fixed
budget). The horizon is `train_steps`, or with a time budget
(--train_minutes) the step the measured step rate reaches by the deadline
(`planned_horizon`), re-planned as training goes (`training/trainer.py`).
"""

import keras

ops = keras.ops


def learning_rate(step, d_model, warmup_steps=4000, scale=1.0):
  """Eq. 3, times `scale`.

  Args:
    step: the update, 1-based (the first update is step 1).
    d_model: the model width.
    warmup_steps: the steps of the linear rise.
    scale: a factor on the whole rate.
  Returns:
    The rate, float32.
  """
  step = ops.cast(step, "float32")
  return scale * d_model**-0.5 * ops.minimum(
      ops.rsqrt(ops.maximum(step, 1.0)), step * warmup_steps**-1.5)


def budget_learning_rate(step, d_model, warmup_steps, scale, horizon):
  """Eq. 3's linear rise, then a linear decay to zero at `horizon`.

  The decay starts at the peak, step `warmup_steps`, or at `horizon` / 2
  when the budget is shorter than two warm-ups (a lower peak, so that the
  run still decays over half of it).

  Args:
    step: the update, 1-based.
    d_model, warmup_steps, scale: as `learning_rate`'s.
    horizon: the step at which the rate reaches zero (stays zero after).
  Returns:
    The rate, float32.
  """
  step = ops.cast(step, "float32")
  horizon = ops.maximum(ops.cast(horizon, "float32"), 1.0)
  peak_step = ops.minimum(float(warmup_steps), horizon / 2)
  peak = learning_rate(peak_step, d_model, warmup_steps, scale)
  left = ops.clip((horizon - step) / ops.maximum(
      horizon - peak_step, 1.0), 0.0, 1.0)
  return ops.where(step <= peak_step,
                  learning_rate(step, d_model, warmup_steps, scale),
                  peak * left)


def planned_horizon(step, train_steps, seconds_left=None, steps_per_second=0):
  """The last step of a run's budget.

  Args:
    step: the steps made so far.
    train_steps: the run's step budget.
    seconds_left: what is left of a time budget (--train_minutes); None:
      no time budget.
    steps_per_second: the measured rate (0: not measured yet).
  Returns:
    `train_steps`, or the step that rate reaches when the time is up if
    that comes first.
  """
  if seconds_left is None or steps_per_second <= 0:
    return train_steps
  return int(min(train_steps,
                 step + round(steps_per_second * max(seconds_left, 0.0))))


@keras.saving.register_keras_serializable(package="tf_transformer")
class TransformerSchedule(keras.optimizers.schedules.LearningRateSchedule):
  """Eq. 3 for a Keras optimizer, or with `horizon` the budget schedule.
  Keras passes the number of updates already made, so update n (n = 1,
  2, ...) gets the rate of step n.

  Args:
    d_model, warmup_steps, scale: as `learning_rate`'s.
    horizon: None for eq. 3; else a number or a variable (which the
      trainer re-plans) for `budget_learning_rate`.
  """

  def __init__(self, d_model, warmup_steps=4000, scale=1.0, horizon=None):
    self.d_model = d_model
    self.warmup_steps = warmup_steps
    self.scale = scale
    self.horizon = horizon

  def __call__(self, iterations):
    if self.horizon is None:
      return learning_rate(iterations + 1, self.d_model, self.warmup_steps,
                           self.scale)
    return budget_learning_rate(iterations + 1, self.d_model,
                                self.warmup_steps, self.scale, self.horizon)

  def get_config(self):
    horizon = self.horizon
    if horizon is not None and not isinstance(horizon, (int, float)):
      horizon = float(ops.convert_to_numpy(horizon))
    return {"d_model": self.d_model, "warmup_steps": self.warmup_steps,
            "scale": self.scale, "horizon": horizon}


def for_config(config, horizon=None):
  """The schedule a config's training part asks for.

  Args:
    config: a `TransformerConfig`.
    horizon: the budget schedule's horizon (a `tf.Variable` the trainer
      re-plans); None: `train_steps`.
  Returns:
    A `TransformerSchedule`.
  """
  t = config.training
  if t.learning_rate_schedule == "eq3":
    horizon = None
  elif horizon is None:
    horizon = t.train_steps
  return TransformerSchedule(config.model.d_model, t.warmup_steps,
                             t.learning_rate_scale, horizon)
