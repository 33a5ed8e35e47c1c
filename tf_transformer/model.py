"""The Transformer encoder-decoder (section 3, Figure 1) as a Keras model.

    memory, source_mask = model.encode(source_ids)
    logits = model.decode(target_input_ids, memory, source_mask)
    logits = model((source_ids, target_input_ids))          # teacher forcing

A search decodes one position at a time with `decoding/step.py`, from the
weights that `model.named_weights()` hands over (`layers/named_weights.py`).

Token ids use `special_ids`: PAD_ID is masked everywhere; the decoder input is
the target shifted right behind BOS_ID.
"""

import keras

from tf_transformer.config import TransformerConfig
from tf_transformer.layers import masks
from tf_transformer.layers import named_weights
from tf_transformer.layers import retired
from tf_transformer.layers.decoder import Decoder
from tf_transformer.layers.embedding import SharedEmbedding
from tf_transformer.layers.embedding import positional_encoding
from tf_transformer.layers.encoder import Encoder


def _stack_arguments(config, num_layers):
  """Encoder and Decoder arguments from a `ModelConfig`, for a stack of
  `num_layers` layers."""
  return dict(num_layers=num_layers, num_heads=config.num_heads,
              d_ff=config.d_ff, d_k=config.d_k, d_v=config.d_v,
              dropout_rate=config.dropout_rate,
              attention_dropout_rate=config.attention_dropout_rate,
              norm_position=config.norm_position,
              layer_norm_epsilon=config.layer_norm_epsilon,
              activation=config.activation)


@keras.saving.register_keras_serializable(package="tf_transformer")
class Transformer(keras.Model):
  """Encoder-decoder with shared embeddings and pre-softmax weights
  (section 3, 3.4).

  The logits are float32 whatever the dtype policy, for the loss's and the
  search's log-softmax; with "mixed_bfloat16" the matmuls run in bfloat16
  and the weights stay float32.

  Args:
    config: a `TransformerConfig` (or its dict, as a .keras file keeps it);
      with `share_embeddings=False` the source embedding, target embedding
      and output projection are three matrices.
    **kwargs: Keras' (`dtype`: a dtype policy, the global one by default,
      reaching every layer).
  """

  def __init__(self, config, **kwargs):
    super().__init__(**kwargs)
    if isinstance(config, dict):
      config = TransformerConfig.from_dict(config)
    self.config = config
    c = config.model
    policy = self.dtype_policy
    embedding = lambda name: SharedEmbedding(c.vocab_size, c.d_model,
                                             name=name, dtype=policy)
    self.source_embedding = embedding("shared_embedding")
    if c.share_embeddings:
      self.target_embedding = self.output_embedding = self.source_embedding
    else:
      self.target_embedding = embedding("target_embedding")
      self.output_embedding = embedding("output_projection")
    self.source_positions = positional_encoding(
        c.positional_encoding, c.max_length, "source_positions", policy)
    self.target_positions = positional_encoding(
        c.positional_encoding, c.max_length, "target_positions", policy)
    self.source_dropout = keras.layers.Dropout(c.dropout_rate, dtype=policy)
    self.target_dropout = keras.layers.Dropout(c.dropout_rate, dtype=policy)
    self.encoder = Encoder(**_stack_arguments(c, c.num_encoder_layers),
                           name="encoder", dtype=policy)
    self.decoder = Decoder(**_stack_arguments(c, c.num_decoder_layers),
                           name="decoder", dtype=policy)

  def build(self, input_shape=None):
    d_model = self.config.model.d_model
    shape = (None, None, d_model)
    for embedding in {id(e): e for e in (
        self.source_embedding, self.target_embedding,
        self.output_embedding)}.values():
      embedding.build()
    if self.config.model.output_bias:
      self.output_bias = self.add_weight(
          name="output_bias", shape=(self.config.model.vocab_size,),
          initializer="zeros")
    self.source_positions.build(shape)
    self.target_positions.build(shape)
    self.encoder.build(shape)
    self.decoder.build(shape, shape)
    self.built = True

  def _embed(self, embedding, positions, dropout, ids, training=None,
             zero_start=False):
    """Token embedding times sqrt(d_model), plus positions, then dropout
    (5.4); with `zero_start`, the first position's token embedding is a
    zero vector (`ModelConfig.decoder_start`)."""
    x = embedding(ids)
    if zero_start:
      later = keras.ops.arange(keras.ops.shape(ids)[1]) > 0
      x = x * keras.ops.cast(later, x.dtype)[:, None]
    return dropout(positions(x), training=training)

  def encode(self, source_ids, training=None, return_attention_scores=False):
    """The encoder on source ids (section 3.1).

    Args:
      source_ids: [batch, source_length] int, PAD-padded.
      training: whether dropout applies.
      return_attention_scores: also return the encoder's attention weights.
    Returns:
      (memory [batch, source_length, d_model], source padding mask [batch,
      source_length]); with `return_attention_scores`, the per-layer weights
      third.
    """
    source_mask = masks.padding_mask(source_ids)
    x = self._embed(self.source_embedding, self.source_positions,
                    self.source_dropout, source_ids, training=training)
    outputs = self.encoder(x, source_mask, training=training,
                           return_attention_scores=return_attention_scores)
    if return_attention_scores:
      return outputs[0], source_mask, outputs[1]
    return outputs, source_mask

  def decode(self, target_input_ids, memory, source_mask, training=None,
             return_attention_scores=False):
    """The decoder on a whole target input at once (teacher forcing).

    Args:
      target_input_ids: [batch, target_length] int, BOS first, PAD-padded.
      memory, source_mask: what `encode` returns.
      training: whether dropout applies.
      return_attention_scores: also return the decoder's attention weights.
    Returns:
      float32 logits [batch, target_length, vocab_size]; with
      `return_attention_scores`, (logits, the per-layer weight dicts).
    """
    x = self._embed(self.target_embedding, self.target_positions,
                    self.target_dropout, target_input_ids, training=training,
                    zero_start=self.config.model.decoder_start == "zero")
    outputs = self.decoder(x, memory, masks.padding_mask(target_input_ids),
                           source_mask, training=training,
                           return_attention_scores=return_attention_scores)
    if return_attention_scores:
      return self._logits(outputs[0]), outputs[1]
    return self._logits(outputs)

  def _logits(self, x):
    logits = keras.ops.cast(self.output_embedding.logits(x), "float32")
    if self.config.model.output_bias:
      logits = logits + keras.ops.cast(self.output_bias, "float32")
    return logits

  def named_weights(self) -> named_weights.Model:
    """Every weight of the model, by role (`layers/named_weights.py`)."""
    c = self.config.model
    return named_weights.Model(
        self.source_embedding.named_weights(),
        self.target_embedding.named_weights(),
        self.output_embedding.named_weights(),
        self.source_embedding.multiplier,
        self.source_positions.named_weights(),
        self.target_positions.named_weights(),
        self.encoder.named_weights(), self.decoder.named_weights(),
        c.norm_position, c.layer_norm_epsilon, c.positional_encoding,
        c.activation, c.decoder_start,
        self.output_bias if c.output_bias else None)

  def call(self, inputs, training=None):
    """Teacher forcing.

    Args:
      inputs: (source_ids [batch, source_length], target_input_ids [batch,
        target_length]).
      training: whether dropout applies.
    Returns:
      float32 logits [batch, target_length, vocab_size].
    """
    source_ids, target_input_ids = inputs
    memory, source_mask = self.encode(source_ids, training=training)
    return self.decode(target_input_ids, memory, source_mask,
                       training=training)

  def attention_weights(self, source_ids, target_input_ids):
    """Every attention distribution of a teacher-forced pass, for plots.

    Args:
      source_ids: [batch, S] int.
      target_input_ids: [batch, T] int.
    Returns:
      {"encoder_self": per layer [batch, heads, S, S], "decoder_self": per
      layer [batch, heads, T, T], "encoder_decoder": per layer [batch, heads,
      T, S]}.
    """
    return self.logits_and_attention(source_ids, target_input_ids)[1]

  def logits_and_attention(self, source_ids, target_input_ids):
    """One teacher-forced pass (inference): the logits and every attention
    distribution behind them, for scores and alignments of given targets.

    Args:
      source_ids: [batch, S] int.
      target_input_ids: [batch, T] int.
    Returns:
      (float32 logits [batch, T, vocab_size], `attention_weights`'s dict).
    """
    memory, source_mask, encoder_weights = self.encode(
        source_ids, return_attention_scores=True)
    logits, decoder_weights = self.decode(
        target_input_ids, memory, source_mask, return_attention_scores=True)
    return logits, {"encoder_self": encoder_weights,
                    "decoder_self": [w["self"] for w in decoder_weights],
                    "encoder_decoder": [w["cross"] for w in decoder_weights]}

  def get_config(self):
    return {**super().get_config(), "config": self.config.to_dict()}

  @classmethod
  def from_config(cls, config):
    # A .keras file of release 0.1 keeps `xla_attention` (layers/retired.py).
    return cls(**retired.without_retired(config))


def build_model(config: TransformerConfig, dtype=None) -> Transformer:
  """A Transformer with all its weights created.

  Args:
    config: a `TransformerConfig`.
    dtype: a Keras dtype policy; None: the global one.
  Returns:
    The built `Transformer`.
  """
  model = Transformer(config, dtype=dtype)
  model.build()
  return model


def with_dtype_policy(model: Transformer, dtype) -> Transformer:
  """A copy of `model` under another dtype policy, its weights cast to the
  policy's variable dtype: with "bfloat16", half the bytes that an export
  keeps and that every decoding step reads, its matmuls in bfloat16; layer
  norms, softmaxes and the logits stay float32 (docs/model.md).

  Args:
    model: a `Transformer`.
    dtype: the policy's name, e.g. "bfloat16".
  Returns:
    The copy.
  """
  copy = build_model(model.config, dtype)
  copy.set_weights(model.get_weights())
  return copy

