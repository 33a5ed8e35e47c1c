"""The learning rate of section 5.3, eq. 3:

    lrate = d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)

rising linearly for `warmup_steps` steps, then decaying with the inverse
square root of the step. At step 0 the min is 0 (no division by zero).
"""

import keras
import tensorflow as tf


def learning_rate(step, d_model, warmup_steps=4000, scale=1.0):
  """Eq. 3 at `step` (1-based: the first update is step 1), times `scale`."""
  step = tf.cast(step, tf.float32)
  return scale * d_model**-0.5 * tf.minimum(
      tf.math.rsqrt(tf.maximum(step, 1.0)), step * warmup_steps**-1.5)


@keras.saving.register_keras_serializable(package="tf_transformer")
class TransformerSchedule(keras.optimizers.schedules.LearningRateSchedule):
  """Eq. 3 for a Keras optimizer. Keras passes the number of updates already
  made, so update n (n = 1, 2, ...) gets eq. 3 at step n."""

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
