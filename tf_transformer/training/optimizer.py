"""Adam with beta1 0.9, beta2 0.98, epsilon 1e-9 and eq. 3 (section 5.3)."""

import keras

from tf_transformer.config import TransformerConfig
from tf_transformer.training import schedule

MIXED_PRECISION = {None: "float32", "": "float32", "bfloat16":
                   "mixed_bfloat16", "float16": "mixed_float16"}


@keras.saving.register_keras_serializable("tf_transformer")
class Adam(keras.optimizers.Adam):
  """Keras' Adam, its update one fused kernel a variable under TensorFlow.

  The update is Keras' (section 5.3's Adam with bias correction):
  m += (g - m)(1 - beta1), v += (g^2 - v)(1 - beta2),
  w -= lr sqrt(1 - beta2^t) / (1 - beta1^t) m / (sqrt(v) + epsilon),
  computed by TensorFlow's `ResourceApplyAdam` in one kernel a variable
  rather than a dozen element-wise ones (fewer kernels a step, and a step
  traced in less time). An embedding's sparse gradient is summed over
  repeated tokens before it is squared, as the dense gradient is. Other
  backends, and amsgrad, use Keras' update.
  """

  def update_step(self, gradient, variable, learning_rate):
    """Args/Returns: as `keras.optimizers.Adam.update_step`."""
    if keras.backend.backend() != "tensorflow" or self.amsgrad:
      return super().update_step(gradient, variable, learning_rate)
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    index = self._get_variable_index(variable)
    return tf.raw_ops.ResourceApplyAdam(
        var=variable.handle, m=self._momentums[index].value.handle,
        v=self._velocities[index].value.handle,
        grad=tf.cast(tf.convert_to_tensor(gradient), variable.dtype),
        **self._scalars(learning_rate, variable.dtype))

  def _backend_update_step(self, grads, trainable_variables, learning_rate):
    # The scalars of `update_step`, made once an update, not once a
    # variable (fewer ops to trace); valid only within this update.
    object.__setattr__(self, "_update_scalars", {})  # untracked by Keras
    try:
      return super()._backend_update_step(grads, trainable_variables,
                                          learning_rate)
    finally:
      object.__setattr__(self, "_update_scalars", None)

  def _scalars(self, learning_rate, dtype):
    """`ResourceApplyAdam`'s scalar inputs in `dtype`."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    made = self.__dict__.get("_update_scalars")
    if made is not None and dtype in made:
      return made[dtype]
    step = tf.cast(self.iterations + 1, dtype)
    cast = lambda value: tf.cast(value, dtype)
    scalars = dict(lr=cast(learning_rate), beta1=cast(self.beta_1),
                   beta2=cast(self.beta_2), epsilon=cast(self.epsilon),
                   beta1_power=tf.pow(cast(self.beta_1), step),
                   beta2_power=tf.pow(cast(self.beta_2), step))
    if made is not None:
      made[dtype] = scalars
    return scalars


def create_optimizer(config: TransformerConfig, mixed_precision=None):
  """The paper's optimizer.

  Args:
    config: a `TransformerConfig`: Adam's settings and the schedule.
    mixed_precision: "float16" wraps it for dynamic loss scaling.
  Returns:
    A Keras optimizer.
  """
  optimizer = Adam(
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
