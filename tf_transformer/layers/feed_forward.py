"""Position-wise feed-forward network (section 3.3, eq. 2)."""

import keras

from tf_transformer.layers.policy import PolicyLayer


@keras.saving.register_keras_serializable(package="tf_transformer")
class PositionwiseFeedForward(PolicyLayer):
  """FFN(x) = max(0, x W1 + b1) W2 + b2, applied to each position alike.

  The inner layer has `d_ff` units; the output has the input's d_model.
  """

  def __init__(self, d_ff, **kwargs):
    super().__init__(**kwargs)
    self.d_ff = d_ff
    self.inner = keras.layers.Dense(d_ff, activation="relu", name="inner",
                                    dtype=self.dtype_policy)
    self.outer = None

  def build(self, x_shape):
    self.inner.build(x_shape)
    self.outer = keras.layers.Dense(x_shape[-1], name="outer",
                                    dtype=self.dtype_policy)
    self.outer.build(tuple(x_shape[:-1]) + (self.d_ff,))

  def call(self, x):
    return self.outer(self.inner(x))

  def get_config(self):
    return {**super().get_config(), "d_ff": self.d_ff}
