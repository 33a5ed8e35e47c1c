"""Adam with beta1 0.9, beta2 0.98, epsilon 1e-9 and eq. 3 (section 5.3)."""

import keras

from tf_transformer.config import TransformerConfig
from tf_transformer.training import schedule

MIXED_PRECISION = {None: "float32", "": "float32", "bfloat16":
                   "mixed_bfloat16", "float16": "mixed_float16"}


def create_optimizer(config: TransformerConfig, mixed_precision=None):
  """The paper's optimizer.

  Args:
    config: a `TransformerConfig`: Adam's settings and the schedule.
    mixed_precision: "float16" wraps it for dynamic loss scaling.
  Returns:
    A Keras optimizer.
  """
  optimizer = keras.optimizers.Adam(
      schedule.for_config(config),
      beta_1=config.training.adam_beta_1, beta_2=config.training.adam_beta_2,
      epsilon=config.training.adam_epsilon)
  if mixed_precision == "float16":
    optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
  return optimizer


def set_mixed_precision(mixed_precision=None):
  """Sets Keras' global dtype policy (before the model is built):
  None -> float32, "bfloat16" or "float16" -> mixed precision."""
  if mixed_precision not in MIXED_PRECISION:
    raise ValueError(f"--mixed_precision={mixed_precision}: expected "
                     "bfloat16, float16 or empty")
  keras.mixed_precision.set_global_policy(MIXED_PRECISION[mixed_precision])
