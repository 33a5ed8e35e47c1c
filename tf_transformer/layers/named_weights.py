"""The model's weights as plain named structures, the one walk over its
layers: each layer hands over its own (`named_weights()`), so that the code
that reads them elsewhere (the decoding step's `decoding/step_weights.py`,
the CTranslate2 export) reads no layer's attributes.

Values are the layers' variables as they hold them: kernels [in, out], no
scaling, folding or cast.
"""

import typing


class Affine(typing.NamedTuple):
  """x W + b: kernel [in, out], bias [out]."""
  kernel: typing.Any
  bias: typing.Any


class Norm(typing.NamedTuple):
  """Layer normalization's gain and bias (Ba et al., 2016)."""
  gamma: typing.Any
  beta: typing.Any


class Attention(typing.NamedTuple):
  """Multi-head attention (section 3.2.2): W^Q, W^K, W^V for all heads at
  once, and W^O."""
  query: Affine
  key: Affine
  value: Affine
  output: Affine
  num_heads: int


class FeedForward(typing.NamedTuple):
  """Eq. 2: W_1, b_1 (inner, d_ff units) and W_2, b_2 (outer)."""
  inner: Affine
  outer: Affine


class Layer(typing.NamedTuple):
  """One encoder or decoder layer (section 3.1): each sub-layer with the
  normalization of its residual connection; `cross_attention` (the
  encoder-decoder attention) is None in an encoder layer."""
  self_attention: Attention
  self_attention_norm: Norm
  feed_forward: FeedForward
  feed_forward_norm: Norm
  cross_attention: typing.Optional[Attention] = None
  cross_attention_norm: typing.Optional[Norm] = None


class Stack(typing.NamedTuple):
  """An encoder or decoder stack: its layers, and the normalization that
  closes a pre-norm stack (None post-norm)."""
  layers: tuple
  final_norm: typing.Optional[Norm]


class Model(typing.NamedTuple):
  """The whole Transformer (section 3): embeddings [vocab, d_model] (one
  matrix three times when shared, 3.4), each multiplied by
  `embedding_scale`; learned position tables [rows, d_model], or None for
  the sinusoids of section 3.5 (`positional_encoding` says which layout);
  both stacks; the residual connections' `norm_position` ("post", the
  paper's, or "pre") and normalization `epsilon`; the feed-forward's
  `activation`; `decoder_start` ("bos", or "zero": the first target
  position embeds a zero vector); the logits' `output_bias` [vocab] or
  None."""
  source_embedding: typing.Any
  target_embedding: typing.Any
  output_embedding: typing.Any
  embedding_scale: float
  source_positions: typing.Any
  target_positions: typing.Any
  encoder: Stack
  decoder: Stack
  norm_position: str
  epsilon: float
  positional_encoding: str = "sinusoidal"
  activation: str = "relu"
  decoder_start: str = "bos"
  output_bias: typing.Any = None
