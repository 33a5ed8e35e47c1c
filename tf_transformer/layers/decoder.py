"""Decoder layer and decoder stack (section 3.1, Figure 1 right).

Each layer: masked multi-head self-attention, multi-head attention over the
encoder output ("memory"), then the feed-forward network, each inside a
residual connection with layer normalization.

Masking: decoder self-attention is causal plus padding (position i attends to
real positions <= i); encoder-decoder attention sees every real source token.

These layers compute a whole target at once (training, teacher forcing,
attention weights). A search's incremental step, one position at a time
over a cache, is `decoding/step.py`, fed by `named_weights()`.
"""

import keras

from tf_transformer.layers import masks
from tf_transformer.layers import named_weights
from tf_transformer.layers.encoder import _TransformerBlock
from tf_transformer.layers.encoder import _TransformerStack


@keras.saving.register_keras_serializable(package="tf_transformer")
class DecoderLayer(_TransformerBlock):
  """Masked self-attention, encoder-decoder attention and feed-forward,
  each in its residual block (section 3.1).

  Args:
    num_heads, d_ff, d_k, d_v, dropout_rate, attention_dropout_rate,
        norm_position, layer_norm_epsilon, activation: each
        layer's, as `EncoderLayer`.
  """

  def build(self, x_shape, memory_shape=None, self_attention_mask_shape=None,
            cross_attention_mask_shape=None):
    """Weights from the shapes of the call's arguments, named as Keras 3
    names them; only `x_shape` and `memory_shape` decide any."""
    input_shape, memory_shape = x_shape, memory_shape or x_shape
    self.self_attention = self._attention(input_shape[-1], "self_attention")
    self.self_attention.build(input_shape)
    self.cross_attention = self._attention(input_shape[-1], "cross_attention")
    self.cross_attention.build(input_shape, memory_shape)
    self.self_attention_residual = self._residual("self_attention_residual")
    self.cross_attention_residual = self._residual("cross_attention_residual")
    self.feed_forward_residual = self._residual("feed_forward_residual")
    for residual in (self.self_attention_residual,
                     self.cross_attention_residual,
                     self.feed_forward_residual):
      residual.build(input_shape)
    self.feed_forward.build(input_shape)

  def call(self, x, memory=None, self_attention_mask=None,
           cross_attention_mask=None, training=None,
           return_attention_scores=False):
    """The layer on a whole target at once.

    Args:
      x: [batch, target_length, d_model].
      memory: the encoder output, [batch, source_length, d_model].
      self_attention_mask, cross_attention_mask: bool, True = may attend,
        broadcastable to [batch, heads, query_length, key_length].
      training: whether dropout applies.
      return_attention_scores: also return the attention weights.
    Returns:
      [batch, target_length, d_model]; with `return_attention_scores`,
      (that, {"self": [batch, heads, target_length, target_length],
      "cross": [batch, heads, target_length, source_length]}).
    """
    x, self_weights = self._attention_block(
        self.self_attention_residual, self.self_attention, x, training,
        return_attention_scores, attention_mask=self_attention_mask)
    x, cross_weights = self._attention_block(
        self.cross_attention_residual, self.cross_attention, x, training,
        return_attention_scores, value=memory,
        attention_mask=cross_attention_mask)
    x = self._feed_forward_block(x, training)
    weights = {"self": self_weights, "cross": cross_weights}
    return (x, weights) if return_attention_scores else x

  def named_weights(self) -> named_weights.Layer:
    return named_weights.Layer(
        self.self_attention.named_weights(),
        self.self_attention_residual.named_weights(),
        self.feed_forward.named_weights(),
        self.feed_forward_residual.named_weights(),
        self.cross_attention.named_weights(),
        self.cross_attention_residual.named_weights())


@keras.saving.register_keras_serializable(package="tf_transformer")
class Decoder(_TransformerStack):
  """A stack of `num_layers` identical decoder layers (N = 6 in the paper,
  section 3.1), closed by a LayerNorm when pre-norm.

  Args:
    num_layers: N.
    num_heads, d_ff, d_k, d_v, dropout_rate, attention_dropout_rate,
        norm_position, layer_norm_epsilon, activation: each
        layer's, as `EncoderLayer`.
  """

  layer_class = DecoderLayer
  decoder_layers = _TransformerStack.stack_layers

  def build(self, x_shape, memory_shape=None, target_padding_mask_shape=None,
            memory_padding_mask_shape=None):
    for layer in self.decoder_layers:
      layer.build(x_shape, memory_shape)
    if self.final_norm is not None:
      self.final_norm.build(x_shape)

  def call(self, x, memory=None, target_padding_mask=None,
           memory_padding_mask=None, training=None,
           return_attention_scores=False):
    """The stack on a whole target at once, each position attending to the
    positions up to its own (section 3.2.3).

    Args:
      x: the embedded target input, [batch, target_length, d_model].
      memory: the encoder output, [batch, source_length, d_model].
      target_padding_mask, memory_padding_mask: [batch, length] bool, True at
        real tokens; None: no padding.
      training: whether dropout applies.
      return_attention_scores: also return the attention weights.
    Returns:
      [batch, target_length, d_model]; with `return_attention_scores`, (that,
      each layer's weights as `DecoderLayer.call` returns them).
    """
    if target_padding_mask is not None:
      self_mask = masks.causal_padding_mask(target_padding_mask)
    else:
      self_mask = masks.causal_mask(keras.ops.shape(x)[1])
    cross_attention_mask = (None if memory_padding_mask is None
                            else masks.key_padding_mask(memory_padding_mask))
    all_weights = []
    for layer in self.decoder_layers:
      x = layer(x, memory, self_mask, cross_attention_mask,
                training=training,
                return_attention_scores=return_attention_scores)
      if return_attention_scores:
        x, weights = x
        all_weights.append(weights)
    if self.final_norm is not None:
      x = self.final_norm(x)
    return (x, all_weights) if return_attention_scores else x
