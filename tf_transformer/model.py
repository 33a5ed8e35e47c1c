"""The Transformer encoder-decoder (section 3, Figure 1) as a Keras model.

    memory, source_mask = model.encode(source_ids)
    logits = model.decode(target_input_ids, memory, source_mask)
    logits = model((source_ids, target_input_ids))          # teacher forcing

Incremental decoding, one position at a time with static shapes (for
`group_size` hypotheses per sentence, ids_at_step has batch * group_size rows):

    cache = model.initial_cache(memory, max_length, group_size=1)
    weights = model.step_weights(max_length)      # once per search
    logits, cache = model.decode_step(ids_at_step, step, cache, source_mask,
                                      weights)
    cache = model.reorder_cache(cache, parents)  # beam search

Token ids use `special_ids`: PAD_ID is masked everywhere; the decoder input is
the target shifted right behind BOS_ID.
"""

import keras
import tensorflow as tf

from tf_transformer.config import TransformerConfig
from tf_transformer.layers import fused_step
from tf_transformer.layers import masks
from tf_transformer.layers.attention import MultiHeadAttention
from tf_transformer.layers.decoder import Decoder
from tf_transformer.layers.embedding import SharedEmbedding
from tf_transformer.layers.embedding import positional_encoding
from tf_transformer.layers.encoder import Encoder


def _stack_arguments(config):
  """Encoder and Decoder arguments from a `ModelConfig`."""
  return dict(num_layers=config.num_layers, num_heads=config.num_heads,
              d_ff=config.d_ff, d_k=config.d_k, d_v=config.d_v,
              dropout_rate=config.dropout_rate,
              attention_dropout_rate=config.attention_dropout_rate,
              norm_position=config.norm_position,
              layer_norm_epsilon=config.layer_norm_epsilon,
              xla_attention=config.xla_attention)


@keras.saving.register_keras_serializable(package="tf_transformer")
class Transformer(keras.Model):
  """Encoder-decoder with shared embeddings and pre-softmax weights (3.4).

  `call((source_ids, target_input_ids))` returns logits
  [batch, target_length, vocab_size]. With `share_embeddings=False` the
  source embedding, target embedding and output projection are three
  matrices.

  `dtype` (a Keras dtype policy, the global one by default) reaches every
  layer: with "mixed_bfloat16" the matmuls run in bfloat16 and the weights
  stay float32. The logits are float32 whatever the policy, for the loss's
  and the search's log-softmax.
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
    self.encoder = Encoder(**_stack_arguments(c), name="encoder",
                           dtype=policy)
    self.decoder = Decoder(**_stack_arguments(c), name="decoder",
                           dtype=policy)

  def build(self, input_shape=None):
    d_model = self.config.model.d_model
    shape = (None, None, d_model)
    for embedding in {id(e): e for e in (
        self.source_embedding, self.target_embedding,
        self.output_embedding)}.values():
      embedding.build()
    self.source_positions.build(shape)
    self.target_positions.build(shape)
    self.encoder.build(shape)
    self.decoder.build(shape, shape)
    self.built = True

  def set_xla_attention(self, enabled: bool):
    """Switches the XLA-compiled attention core on or off in every layer
    (off for exports to TF Serving on CPU)."""
    self.config = self.config.replace(xla_attention=bool(enabled))
    for layer in self._flatten_layers():
      if isinstance(layer, MultiHeadAttention):
        layer.xla_attention = bool(enabled)
      if hasattr(layer, "arguments"):
        layer.arguments["xla_attention"] = bool(enabled)

  def _embed(self, embedding, positions, dropout, ids, start=0, training=None):
    """Token embedding times sqrt(d_model), plus positions, then dropout (5.4)."""
    return dropout(positions(embedding(ids), start=start), training=training)

  def encode(self, source_ids, training=None, return_attention_scores=False):
    """Returns (memory [batch, source_length, d_model], source padding mask);
    with `return_attention_scores`, the per-layer weights too."""
    source_mask = masks.padding_mask(source_ids)
    x = self._embed(self.source_embedding, self.source_positions,
                    self.source_dropout, source_ids, training=training)
    outputs = self.encoder(x, source_mask, training=training,
                           return_attention_scores=return_attention_scores)
    if return_attention_scores:
      return outputs[0], source_mask, outputs[1]
    return outputs, source_mask

  def initial_cache(self, memory, max_length, group_size=1):
    """Decoder cache for `max_length` target positions of `group_size`
    hypotheses per sentence of this memory (`Decoder.initial_cache`)."""
    return self.decoder.initial_cache(memory, max_length, group_size)

  def decode(self, target_input_ids, memory, source_mask, training=None,
             return_attention_scores=False):
    """Logits [batch, target_length, vocab_size] (float32) for the decoder
    input (teacher forcing); with `return_attention_scores`, (logits, the
    per-layer weights)."""
    x = self._embed(self.target_embedding, self.target_positions,
                    self.target_dropout, target_input_ids, training=training)
    outputs = self.decoder(x, memory, masks.padding_mask(target_input_ids),
                           source_mask, training=training,
                           return_attention_scores=return_attention_scores)
    if return_attention_scores:
      return self._logits(outputs[0]), outputs[1]
    return self._logits(outputs)

  def cached_step(self, ids, step, cache, source_mask):
    """The Keras layers' incremental step: (logits [rows, 1, vocab_size]
    float32, the cache, per-layer attention weights) for `ids` [batch *
    group_size, 1], the tokens at position `step`, with the cache of
    `initial_cache` and `source_mask` [batch, source_length]. The step
    consumes `cache`. `decode` with a cache, one position at a time: the
    path that gives attention weights; a search runs `decode_step`, the
    same function in fewer kernels."""
    x = self._embed(self.target_embedding, self.target_positions,
                    self.target_dropout, ids, start=step)
    x, cache, weights = self.decoder.cached_step(x, cache, step, source_mask)
    return self._logits(x), cache, weights

  def _logits(self, x):
    return tf.cast(self.output_embedding.logits(x), tf.float32)

  def reorder_cache(self, cache, parents):
    """For beam search: row (b, j) continues the hypothesis in slot
    `parents[b, j]` (`Decoder.reorder_cache`)."""
    return self.decoder.reorder_cache(cache, parents)

  def select_sentences(self, cache, sentences):
    """The cache of the sentences at positions `sentences` [n] only
    (`Decoder.select_sentences`)."""
    return self.decoder.select_sentences(cache, sentences)

  def cache_sentence_axes(self, cache):
    """The cache's structure with each entry's sentence axis."""
    return self.decoder.sentence_axes(cache)

  def step_weights(self, max_positions):
    """The weights of `decode_step` (`layers/fused_step.StepWeights`) for
    outputs of up to `max_positions` tokens, as tensors computed from the
    model's variables: prepare them once per search, or once per export."""
    return fused_step.prepare(self, max_positions)

  def decode_step(self, ids, step, cache, source_mask, weights):
    """One incremental decoding step as a search runs it: (logits [rows,
    vocab] float32, cache) for `ids` [rows, 1] at position `step`, with
    `weights` from `step_weights`. The same function as `decode` with a
    cache (tests/test_fused_step.py), in fewer, fused kernels
    (`layers/fused_step.py`); the step consumes `cache`."""
    return fused_step.decoder_step(weights, fused_step.shape_of(self), ids,
                                   step, cache, source_mask)

  def call(self, inputs, training=None):
    source_ids, target_input_ids = inputs
    memory, source_mask = self.encode(source_ids, training=training)
    return self.decode(target_input_ids, memory, source_mask,
                       training=training)

  def attention_weights(self, source_ids, target_input_ids):
    """Every attention distribution of a teacher-forced pass, for plots:
    {"encoder_self": [per layer [batch, heads, S, S]],
     "decoder_self": [... [batch, heads, T, T]],
     "encoder_decoder": [... [batch, heads, T, S]]}."""
    memory, source_mask, encoder_weights = self.encode(
        source_ids, return_attention_scores=True)
    _, decoder_weights = self.decode(target_input_ids, memory, source_mask,
                                     return_attention_scores=True)
    return {"encoder_self": encoder_weights,
            "decoder_self": [w["self"] for w in decoder_weights],
            "encoder_decoder": [w["cross"] for w in decoder_weights]}

  def get_config(self):
    return {**super().get_config(), "config": self.config.to_dict()}

  @classmethod
  def from_config(cls, config):
    return cls(**config)


def build_model(config: TransformerConfig, dtype=None) -> Transformer:
  """A Transformer with all its weights created, under the dtype policy
  `dtype` (None: the global one)."""
  model = Transformer(config, dtype=dtype)
  model.build()
  return model


def with_dtype_policy(model: Transformer, dtype) -> Transformer:
  """A copy of `model` under the dtype policy `dtype`, its weights cast to
  the policy's variable dtype: with "bfloat16", half the bytes that an export
  keeps and that every decoding step reads, its matmuls in bfloat16; layer
  norms, softmaxes and the logits stay float32 (docs/model.md)."""
  copy = build_model(model.config, dtype)
  copy.set_weights(model.get_weights())
  return copy
