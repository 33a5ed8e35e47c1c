"""Closed-form parameter count and forward FLOPs of a config.

Counts follow the layers exactly (projections with biases, LayerNorm gain and
bias, shared embedding counted once), so `parameter_count(config)` equals
`build_model(config).count_params()`. FLOPs count a multiply-add as 2.
"""

from tf_transformer.config import ModelConfig


def _attention_params(c: ModelConfig) -> int:
  qk = 2 * (c.d_model * c.num_heads * c.d_k + c.num_heads * c.d_k)
  v = c.d_model * c.num_heads * c.d_v + c.num_heads * c.d_v
  o = c.num_heads * c.d_v * c.d_model + c.d_model
  return qk + v + o


def _feed_forward_params(c: ModelConfig) -> int:
  return c.d_model * c.d_ff + c.d_ff + c.d_ff * c.d_model + c.d_model


def parameter_count(c: ModelConfig) -> int:
  """Trainable parameters of `Transformer(c)`."""
  norm = 2 * c.d_model
  encoder_layer = _attention_params(c) + _feed_forward_params(c) + 2 * norm
  decoder_layer = 2 * _attention_params(c) + _feed_forward_params(c) + 3 * norm
  final_norms = 2 * norm if c.norm_position == "pre" else 0
  embeddings = (1 if c.share_embeddings else 3) * c.vocab_size * c.d_model
  positions = (2 * c.max_length * c.d_model
               if c.positional_encoding == "learned" else 0)
  return (embeddings + positions + c.num_encoder_layers * encoder_layer
          + c.num_decoder_layers * decoder_layer + final_norms)


def forward_flops(c: ModelConfig, source_length: int,
                  target_length: int) -> int:
  """Matmul FLOPs of one teacher-forced forward pass of one sentence pair."""
  s, t, h = source_length, target_length, c.num_heads
  def attention(queries, keys):
    return 2 * (queries * c.d_model * h * c.d_k          # Q W^Q
                + keys * c.d_model * h * (c.d_k + c.d_v)  # K W^K, V W^V
                + queries * keys * h * (c.d_k + c.d_v)    # Q K^T, weights V
                + queries * h * c.d_v * c.d_model)        # W^O
  feed_forward = lambda length: 2 * length * 2 * c.d_model * c.d_ff
  encoder = c.num_encoder_layers * (attention(s, s) + feed_forward(s))
  decoder = c.num_decoder_layers * (attention(t, t) + attention(t, s)
                                    + feed_forward(t))
  softmax = 2 * t * c.d_model * c.vocab_size
  return encoder + decoder + softmax


def flops_per_token(c: ModelConfig, sequence_length: int = 32) -> int:
  """Forward FLOPs per token (source plus target tokens) for sentence pairs
  of `sequence_length` tokens on each side. Times 3 for a training step
  (forward and backward), times tokens/s for FLOP/s (Table 2's estimate)."""
  flops = forward_flops(c, sequence_length, sequence_length)
  return flops // (2 * sequence_length)
