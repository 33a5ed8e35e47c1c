"""The residual connection around every sub-layer (sections 3.1 and 5.4).

Post-norm, the paper's: LayerNorm(x + Dropout(Sublayer(x))).
Pre-norm, an option: x + Dropout(Sublayer(LayerNorm(x))), whose stack then
ends with one more LayerNorm.
"""

import keras

from tf_transformer.layers import named_weights
from tf_transformer.layers.policy import PolicyLayer


@keras.saving.register_keras_serializable(package="tf_transformer")
class ResidualNorm(PolicyLayer):
  """The residual block around one sub-layer (sections 3.1, 5.4):
  `y = sublayer(block.normalize_input(x))`, then `block(x, y)`.

  Args:
    dropout_rate: P_drop on the sub-layer's output.
    norm_position: "post", LayerNorm(x + Dropout(y)) (the paper's), or "pre",
      x + Dropout(y) with y computed on LayerNorm(x).
    layer_norm_epsilon: the LayerNorm's epsilon.
  """

  def __init__(self, dropout_rate=0.1, norm_position="post",
               layer_norm_epsilon=1e-6, **kwargs):
    super().__init__(**kwargs)
    if norm_position not in ("post", "pre"):
      raise ValueError(f"norm_position={norm_position!r}: expected 'post' or "
                       "'pre'")
    self.dropout_rate = dropout_rate
    self.norm_position = norm_position
    self.layer_norm_epsilon = layer_norm_epsilon
    self.dropout = keras.layers.Dropout(dropout_rate,
                                        dtype=self.dtype_policy)
    self.layer_norm = keras.layers.LayerNormalization(
        epsilon=layer_norm_epsilon, name="layer_norm",
        dtype=self.dtype_policy)

  def build(self, x_shape, sublayer_output_shape=None):
    self.layer_norm.build(x_shape)

  def normalize_input(self, x):
    """The sub-layer's input: x (post-norm) or LayerNorm(x) (pre-norm)."""
    return self.layer_norm(x) if self.norm_position == "pre" else x

  def call(self, x, sublayer_output, training=None):
    """Args:
      x: the block's input, [..., d_model].
      sublayer_output: the sub-layer's output on `normalize_input(x)`.
      training: whether dropout applies.
    Returns:
      The block's output, [..., d_model].
    """
    residual = x + self.dropout(sublayer_output, training=training)
    return residual if self.norm_position == "pre" else self.layer_norm(residual)

  def named_weights(self) -> named_weights.Norm:
    """The normalization's gamma and beta."""
    return named_weights.Norm(self.layer_norm.gamma, self.layer_norm.beta)

  def get_config(self):
    return {**super().get_config(), "dropout_rate": self.dropout_rate,
            "norm_position": self.norm_position,
            "layer_norm_epsilon": self.layer_norm_epsilon}
