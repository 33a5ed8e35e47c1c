"""What the decoding step multiplies by (`decoding/step.py`), prepared once
per search or export from the model's named weights
(`layers/named_weights.py`), in the step's compute dtype:

- Q, K and V of the self-attention are one kernel, with 1 / sqrt(d_k)
  (eq. 1) folded into W^Q (exact when d_k is a power of 4, as 64 is), as
  is the encoder-decoder attention's W^Q;
- the target embeddings are the model's own table, unscaled (the step
  scales the rows it reads, 3.4), and, where it holds the compute dtype,
  the model's variable itself, so that an export stores it once; the
  positional encodings are a table read by row (3.5);
- layer normalization (Ba et al., 2016: gamma * (x - mean) / sqrt(variance
  + epsilon) + beta, in float32) leaves its beta to the affine maps that
  follow it: a matmul's input x + beta is x W + (beta W + b), and in a
  post-norm stack the residual x + beta is added by the next sub-layer's
  output bias. Each beta is folded into those biases, which saves two
  kernels a normalization. A normalization whose output feeds matmuls only
  (every one of a pre-norm stack, and a post-norm stack's last) leaves its
  gamma to them too: (x gamma) W = x (diag(gamma) W);
- the feed-forward's inner layer gets the training layer's zero units
  (`feed_forward.inner_padding`);
- the encoder's layers come prepared alike (`encoding.prepare`), for the
  search's encoder on the real tokens only.
"""

import math
import typing

import tensorflow as tf

from tf_transformer.decoding import encoding
from tf_transformer.layers import named_weights as named
from tf_transformer.layers.embedding import sinusoid_table
from tf_transformer.layers.feed_forward import inner_padding
from tf_transformer.layers.feed_forward import padded_weights


class StepLayer(typing.NamedTuple):
  """One decoder layer's weights as the step multiplies by them (the
  biases with the betas of the normalizations before them folded in)."""
  qkv_kernel: tf.Tensor  # [d_model, heads * (2 d_k + d_v)], W^Q scaled
  qkv_bias: tf.Tensor
  self_output_kernel: tf.Tensor  # W^O of the self-attention
  self_output_bias: tf.Tensor
  self_gamma: typing.Optional[tf.Tensor]  # the gain of the sub-layer's
  # LayerNorm; None where the matmuls after it have it (pre-norm)
  cross_query_kernel: tf.Tensor  # W^Q of the encoder-decoder attention, scaled
  cross_query_bias: tf.Tensor
  cross_key_kernel: tf.Tensor  # W^K, W^V of the memory (as the layer has
  cross_key_bias: tf.Tensor  # them: computed once per sentence)
  cross_value_kernel: tf.Tensor
  cross_value_bias: tf.Tensor
  cross_output_kernel: tf.Tensor
  cross_output_bias: tf.Tensor
  cross_gamma: typing.Optional[tf.Tensor]
  inner_kernel: tf.Tensor  # W_1, b_1 of eq. 2, with zero inner units
  # appended where `inner_padding` asks
  inner_bias: tf.Tensor
  outer_kernel: tf.Tensor  # W_2, b_2
  outer_bias: tf.Tensor
  feed_forward_gamma: typing.Optional[tf.Tensor]  # None also for the last
  # layer of a post-norm stack, whose output feeds the output projection only


class StepWeights(typing.NamedTuple):
  """Everything a decoding step multiplies by."""
  embeddings: tf.Tensor  # the target embeddings, unscaled (the step scales
  # the rows it reads by `Shape.embedding_scale`, 3.4): the model's variable
  # where it holds the compute dtype
  positions: tf.Tensor  # [max_positions, d_model] (3.5)
  layers: tuple
  output_kernel: tf.Tensor  # [d_model, vocab]: the pre-softmax transform,
  # with the last normalization's gamma folded in (None where output_rows
  # holds it)
  output_bias: tf.Tensor  # [vocab]: the last normalization's beta, folded
  # [vocab, d_model]: output_kernel transposed, kept instead of it by a
  # shortlist export (`shortlist.with_output_rows`) to gather its pieces as
  # rows; else None
  output_rows: typing.Optional[tf.Tensor] = None
  # The encoder's (`encoding.EncoderWeights`), for a search's encoder on the
  # real tokens only; None: the Keras layers encode
  encoder: typing.Any = None


class _Affine(typing.NamedTuple):
  """x W + b in float32, the betas folded in before the cast to the
  compute dtype."""
  kernel: tf.Tensor
  bias: tf.Tensor

  def fold(self, beta, gamma=None):
    """The map of x whose input was x + beta, or x gamma + beta: b +=
    beta W, and W becomes diag(gamma) W."""
    bias = self.bias + tf.linalg.matvec(self.kernel, beta, transpose_a=True)
    kernel = self.kernel if gamma is None else gamma[:, tf.newaxis] * (
        self.kernel)
    return _Affine(kernel, bias)

  def add(self, beta):
    """The map plus beta: b += beta (a post-norm residual's beta)."""
    return self._replace(bias=self.bias + beta)

  def cast(self, dtype):
    return tf.cast(self.kernel, dtype), tf.cast(self.bias, dtype)


def _f32(x):
  return tf.cast(x, tf.float32)


def _shared(variable, dtype):
  """`variable` itself where it holds `dtype` (an export then stores it
  once, with the model's variables), else its values cast to `dtype`."""
  if tf.as_dtype(variable.dtype) == tf.as_dtype(dtype):
    return variable
  return tf.cast(variable, dtype)


def _affine(*affines, scale=1.0):
  """One map of the named affine maps side by side (outputs concatenated),
  in float32, times `scale`."""
  return _Affine(*[tf.concat([_f32(a[i]) * scale for a in affines], axis=-1)
                   for i in range(2)])


def _feed_forward(weights, beta_in, gamma_in, residual_beta, dtype, d_ff):
  """(W_1, b_1, W_2, b_2) of eq. 2 with the betas and gain folded in, and
  the training layer's zero inner units."""
  inner_kernel, inner_bias = _affine(weights.inner).fold(
      beta_in, gamma_in).cast(dtype)
  outer_kernel, outer_bias = _affine(weights.outer).add(residual_beta).cast(
      dtype)
  return (*padded_weights(inner_kernel, inner_bias, outer_kernel,
                         inner_padding(d_ff, dtype)), outer_bias)


def _layer(layer, beta_in, post_norm, last, dtype):
  """(`StepLayer`, beta_out, gamma_out) of a `named_weights.Layer`:
  `beta_in` the beta the layer's input lacks (post-norm: the previous
  layer's last; zeros for the embeddings); beta_out the one its output lacks
  (post-norm), else zeros; gamma_out the gain it lacks (the `last` layer of
  a post-norm stack), else None."""
  norms = (layer.self_attention_norm, layer.cross_attention_norm,
           layer.feed_forward_norm)
  betas = [_f32(norm.beta) for norm in norms]
  gammas = [_f32(norm.gamma) for norm in norms]
  # The gains the step applies: pre-norm, none (each normalization feeds
  # its sub-layer's first matmul only, which takes its gain); post-norm,
  # all but the last layer's last (the output projection takes that one).
  # (Applied ones keep the variables' dtype: a bfloat16 export stores
  # them in bfloat16, as every other weight.)
  kept = [tf.convert_to_tensor(norm.gamma) for norm in norms]
  applied = [None] * 3 if not post_norm else kept[:2] + [
      None if last else kept[2]]
  folded = [None] * 3 if post_norm else gammas
  # Each sub-layer's input lacks the beta before it: post-norm, the
  # previous sub-layer's, which its residual lacks too; pre-norm, its own.
  inputs = [beta_in] + betas[:2] if post_norm else betas
  residuals = inputs if post_norm else [tf.zeros_like(b) for b in betas]
  attention, cross = layer.self_attention, layer.cross_attention
  scale = lambda attention: 1.0 / math.sqrt(
      attention.query.kernel.shape[-1] // attention.num_heads)
  qkv = _Affine(*[tf.concat(parts, axis=-1) for parts in zip(
      _affine(attention.query, scale=scale(attention)),
      _affine(attention.key), _affine(attention.value))])
  weights = StepLayer(
      *qkv.fold(inputs[0], folded[0]).cast(dtype),
      *_affine(attention.output).add(residuals[0]).cast(dtype),
      applied[0],
      *_affine(cross.query, scale=scale(cross)).fold(
          inputs[1], folded[1]).cast(dtype),
      *_affine(cross.key).cast(dtype), *_affine(cross.value).cast(dtype),
      *_affine(cross.output).add(residuals[1]).cast(dtype),
      applied[1],
      *_feed_forward(layer.feed_forward, inputs[2], folded[2], residuals[2],
                     dtype, layer.feed_forward.inner.kernel.shape[-1]),
      applied[2])
  if not post_norm:
    return weights, tf.zeros_like(betas[2]), None
  return weights, betas[2], gammas[2] if last else None


def prepare(model: named.Model, dtype, max_positions) -> StepWeights:
  """The weights a decoding step multiplies by, from the layers' own.

  Args:
    model: a `named_weights.Model` (`Transformer.named_weights()`).
    dtype: the compute dtype.
    max_positions: outputs of up to this many positions (a learned table
      keeps its own length).
  Returns:
    `StepWeights`: tensors, and the model's variables where a weight is
    one as it stands (`step.read` makes tensors of them).
  """
  table = _shared(model.target_embedding, dtype)
  d_model = table.shape[-1]
  if model.target_positions is not None:
    positions = _shared(model.target_positions, dtype)
  else:
    positions = sinusoid_table(
        tf.range(max_positions), d_model, dtype,
        kind=model.positional_encoding)
  post_norm = model.norm_position != "pre"
  beta, gamma = tf.zeros([d_model]), None
  layers = []
  for i, layer in enumerate(model.decoder.layers):
    weights, beta, gamma = _layer(layer, beta, post_norm,
                                  i == len(model.decoder.layers) - 1, dtype)
    layers.append(weights)
  if model.decoder.final_norm is not None:
    gamma = _f32(model.decoder.final_norm.gamma)
    beta = _f32(model.decoder.final_norm.beta)
  output_kernel = tf.transpose(_f32(model.output_embedding))
  output_bias = (tf.zeros(tf.shape(output_kernel)[1:])
                 if model.output_bias is None else _f32(model.output_bias))
  output = _Affine(output_kernel, output_bias).fold(beta, gamma)
  return StepWeights(table, positions, tuple(layers), *output.cast(dtype),
                     encoder=encoding.prepare(model, dtype))


def without_encoder(weights):
  """`weights` (`StepWeights`, or an ensemble's tuple of them) without the
  encoder's, for a search that encodes with the Keras layers (XLA's)."""
  if not isinstance(weights, StepWeights):
    return tuple(without_encoder(w) for w in weights)
  return weights._replace(encoder=None)
