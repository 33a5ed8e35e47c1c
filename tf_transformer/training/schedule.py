"""The learning rate of section 5.3, eq. 3:

    lrate = d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)

rising linearly for `warmup_steps` steps, then decaying with the inverse
square root of the step. At step 0 the min is 0 (no division by zero).
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


@keras.saving.register_keras_serializable(package="tf_transformer")
class TransformerSchedule(keras.optimizers.schedules.LearningRateSchedule):
  """Eq. 3 for a Keras optimizer. Keras passes the number of updates
  already made, so update n (n = 1, 2, ...) gets the rate of step n.

  Args:
    d_model, warmup_steps, scale: as `learning_rate`'s.
  """

  def __init__(self, d_model, warmup_steps=4000, scale=1.0):
    self.d_model = d_model
    self.warmup_steps = warmup_steps
    self.scale = scale

  def __call__(self, iterations):
    return learning_rate(iterations + 1, self.d_model, self.warmup_steps,
                         self.scale)

  def get_config(self):
    return {"d_model": self.d_model, "warmup_steps": self.warmup_steps,
            "scale": self.scale}


def for_config(config):
  """The schedule of a config's training part.

  Args:
    config: a `TransformerConfig`.
  Returns:
    A `TransformerSchedule`.
  """
  t = config.training
  return TransformerSchedule(config.model.d_model, t.warmup_steps,
                             t.learning_rate_scale)
