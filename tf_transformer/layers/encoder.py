"""Encoder layer and encoder stack (section 3.1, Figure 1 left).

Each layer: multi-head self-attention, then the position-wise feed-forward
network, each inside a residual connection with layer normalization.
Masking: `padding_mask` [batch, length] is True at real tokens; every position
attends to every real token and to no padding.
"""

import keras

from tf_transformer.layers import masks
from tf_transformer.layers import named_weights
from tf_transformer.layers.attention import MultiHeadAttention
from tf_transformer.layers.feed_forward import PositionwiseFeedForward
from tf_transformer.layers.policy import PolicyLayer
from tf_transformer.layers.residual import ResidualNorm


def sublayer_arguments(num_heads, d_ff, d_k=None, d_v=None, dropout_rate=0.1,
                       attention_dropout_rate=0.0, norm_position="post",
                       layer_norm_epsilon=1e-6, activation="relu"):
  """The arguments an encoder or decoder layer takes, checked and complete."""
  return dict(num_heads=num_heads, d_ff=d_ff, d_k=d_k, d_v=d_v,
              dropout_rate=dropout_rate,
              attention_dropout_rate=attention_dropout_rate,
              norm_position=norm_position,
              layer_norm_epsilon=layer_norm_epsilon, activation=activation)


class _TransformerBlock(PolicyLayer):
  """What encoder and decoder layers share: arguments, attention, residuals."""

  def __init__(self, num_heads, d_ff, d_k=None, d_v=None, dropout_rate=0.1,
               attention_dropout_rate=0.0, norm_position="post",
               layer_norm_epsilon=1e-6, activation="relu", **kwargs):
    super().__init__(**kwargs)
    self.arguments = sublayer_arguments(
        num_heads, d_ff, d_k, d_v, dropout_rate, attention_dropout_rate,
        norm_position, layer_norm_epsilon, activation)
    self.feed_forward = PositionwiseFeedForward(d_ff, activation,
                                                name="feed_forward",
                                                dtype=self.dtype_policy)

  def _attention(self, d_model, name):
    d_k = self.arguments["d_k"] or d_model // self.arguments["num_heads"]
    return MultiHeadAttention(
        self.arguments["num_heads"], d_k, self.arguments["d_v"] or d_k,
        self.arguments["attention_dropout_rate"], name=name,
        dtype=self.dtype_policy)

  def _residual(self, name):
    return ResidualNorm(self.arguments["dropout_rate"],
                        self.arguments["norm_position"],
                        self.arguments["layer_norm_epsilon"], name=name,
                        dtype=self.dtype_policy)

  @staticmethod
  def _attention_block(residual, attention, x, training, weights_asked,
                       **arguments):
    """(the residual block of section 3.1 around `attention` called on x
    with `arguments`, the attention weights if `weights_asked` else None:
    without them the attention runs fused, `attention.fused_attention`)."""
    y = attention(residual.normalize_input(x), training=training,
                  return_attention_scores=weights_asked, **arguments)
    y, weights = y if weights_asked else (y, None)
    return residual(x, y, training=training), weights

  def _feed_forward_block(self, x, training):
    """The residual block of section 3.1 around the feed-forward network."""
    h = self.feed_forward_residual.normalize_input(x)
    return self.feed_forward_residual(x, self.feed_forward(h),
                                      training=training)

  def get_config(self):
    return {**super().get_config(), **self.arguments}


@keras.saving.register_keras_serializable(package="tf_transformer")
class EncoderLayer(_TransformerBlock):
  """Self-attention and feed-forward sub-layers, each in its residual
  block (section 3.1).

  Args:
    num_heads: h, the attention heads (section 3.2.2).
    d_ff: the feed-forward inner width (section 3.3).
    d_k, d_v: per-head query/key and value widths; None: d_model / h.
    dropout_rate: P_drop on each sub-layer's output (section 5.4).
    attention_dropout_rate: dropout on the attention weights (0.0, the
      paper's).
    norm_position: "post" (the paper's LayerNorm(x + Sublayer(x))) or "pre".
    layer_norm_epsilon: the LayerNorm's epsilon.
    activation: the feed-forward's ("relu", eq. 2's; "swish", "gelu",
      "gelu_tanh").
  """

  def build(self, x_shape, padding_mask_shape=None):
    self.self_attention = self._attention(x_shape[-1], "self_attention")
    self.self_attention.build(x_shape)
    self.attention_residual = self._residual("self_attention_residual")
    self.attention_residual.build(x_shape)
    self.feed_forward.build(x_shape)
    self.feed_forward_residual = self._residual("feed_forward_residual")
    self.feed_forward_residual.build(x_shape)

  def call(self, x, padding_mask=None, training=None,
           return_attention_scores=False):
    """The layer on a whole source at once.

    Args:
      x: [batch, length, d_model].
      padding_mask: [batch, length] bool, True at real tokens; None: none.
      training: whether dropout applies.
      return_attention_scores: also return the attention weights.
    Returns:
      [batch, length, d_model]; with `return_attention_scores`, (that, the
      self-attention weights [batch, heads, length, length]).
    """
    mask = None if padding_mask is None else masks.key_padding_mask(padding_mask)
    x, weights = self._attention_block(
        self.attention_residual, self.self_attention, x, training,
        return_attention_scores, attention_mask=mask)
    x = self._feed_forward_block(x, training)
    return (x, weights) if return_attention_scores else x

  def named_weights(self) -> named_weights.Layer:
    return named_weights.Layer(
        self.self_attention.named_weights(),
        self.attention_residual.named_weights(),
        self.feed_forward.named_weights(),
        self.feed_forward_residual.named_weights())


class _TransformerStack(PolicyLayer):
  """What the encoder and decoder stacks share: `num_layers` identical
  layers of `layer_class`, closed by a LayerNorm when pre-norm."""

  layer_class = None

  def __init__(self, num_layers, num_heads, d_ff, d_k=None, d_v=None,
               dropout_rate=0.1, attention_dropout_rate=0.0,
               norm_position="post", layer_norm_epsilon=1e-6,
               activation="relu", **kwargs):
    super().__init__(**kwargs)
    self.num_layers = num_layers
    self.arguments = sublayer_arguments(
        num_heads, d_ff, d_k, d_v, dropout_rate, attention_dropout_rate,
        norm_position, layer_norm_epsilon, activation)
    # One attribute per layer: tf.train.Checkpoint does not see layers
    # kept in a list attribute of a Keras 3 layer.
    for i in range(num_layers):
      setattr(self, f"layer_{i}",
              self.layer_class(**self.arguments, name=f"layer_{i}",
                               dtype=self.dtype_policy))
    self.final_norm = (keras.layers.LayerNormalization(
        epsilon=layer_norm_epsilon, name="final_norm",
        dtype=self.dtype_policy) if norm_position == "pre" else None)

  @property
  def stack_layers(self):
    return [getattr(self, f"layer_{i}") for i in range(self.num_layers)]

  def named_weights(self) -> named_weights.Stack:
    norm = self.final_norm
    return named_weights.Stack(
        tuple(layer.named_weights() for layer in self.stack_layers),
        None if norm is None else named_weights.Norm(norm.gamma, norm.beta))

  def get_config(self):
    return {**super().get_config(), "num_layers": self.num_layers,
            **self.arguments}


@keras.saving.register_keras_serializable(package="tf_transformer")
class Encoder(_TransformerStack):
  """A stack of `num_layers` identical encoder layers (N = 6 in the paper,
  section 3.1), closed by a LayerNorm when pre-norm.

  Args:
    num_layers: N.
    num_heads, d_ff, d_k, d_v, dropout_rate, attention_dropout_rate,
        norm_position, layer_norm_epsilon, activation: each
        layer's, as `EncoderLayer`.
  """

  layer_class = EncoderLayer
  encoder_layers = _TransformerStack.stack_layers

  def build(self, x_shape, padding_mask_shape=None):
    for layer in self.encoder_layers:
      layer.build(x_shape)
    if self.final_norm is not None:
      self.final_norm.build(x_shape)

  def call(self, x, padding_mask=None, training=None,
           return_attention_scores=False):
    """The encoder on embedded inputs.

    Args:
      x: token embeddings plus positions (`layers.embedding`),
        [batch, length, d_model].
      padding_mask: [batch, length] bool, True at real tokens; None: none.
      training: whether dropout applies.
      return_attention_scores: also return the attention weights.
    Returns:
      [batch, length, d_model]; with `return_attention_scores`, (that, a list
      of each layer's [batch, heads, length, length] weights).
    """
    all_weights = []
    for layer in self.encoder_layers:
      x = layer(x, padding_mask, training=training,
                return_attention_scores=return_attention_scores)
      if return_attention_scores:
        x, weights = x
        all_weights.append(weights)
    if self.final_norm is not None:
      x = self.final_norm(x)
    return (x, all_weights) if return_attention_scores else x
