"""The layers' maths: eq. 1 and 2, positions, masks and embeddings. (Every
public layer's Keras conventions, serialization to XLA and dtype policies,
are tests/test_layer_conventions.py's.)"""

import numpy as np
import pytest
import tensorflow as tf

from tf_transformer import layers
from tf_transformer.layers import masks
import rounding

pytestmark = pytest.mark.numeric

B, T, S, D = 2, 5, 7, 16


def _inputs(shape, seed=0):
  return tf.random.stateless_normal(shape, [seed, 1])


def _padding(lengths, length):
  return tf.sequence_mask(lengths, length)


def test_attention_is_equation_1():
  q, k, v = _inputs([1, 1, 3, 4]), _inputs([1, 1, 5, 4], 1), _inputs(
      [1, 1, 5, 2], 2)
  output, weights = layers.scaled_dot_product_attention(q, k, v)
  q64, k64, v64 = (t.numpy()[0, 0].astype(np.float64) for t in (q, k, v))
  scores = (q64 @ k64.T) / np.sqrt(4)
  expected = np.exp(scores - scores.max(-1, keepdims=True))
  expected /= expected.sum(-1, keepdims=True)
  # float32 against float64: within the computation's float32 bound
  # (rounding.py, the attention layer's reference).
  _, bound = rounding.layer_bounds(
      layers.ScaledDotProductAttention(),
      {"query": q.numpy(), "key": k.numpy(), "value": v.numpy(),
       "attention_mask": np.ones([1, 1, 3, 5], bool)})
  output_bound, weights_bound = bound[0, :6], bound[0, 6:]
  rounding.assert_within(weights[0, 0].numpy().ravel(), expected.ravel(),
                         weights_bound)
  rounding.assert_within(output[0, 0].numpy().ravel(),
                         (expected @ v64).ravel(), output_bound)


@pytest.mark.parametrize("d_ff", [32, 128])
def test_feed_forward_is_equation_2(d_ff):
  """Padded (128 float32s: 512 bytes) or not (32), the same function."""
  ff = layers.PositionwiseFeedForward(d_ff=d_ff)
  x = _inputs([B, T, D])
  ff.build(x.shape)
  for i, weight in enumerate(ff.weights):
    weight.assign(_inputs(weight.shape, 3 + i))
  w1, b1, w2, b2 = [w.numpy() for w in (ff.inner.kernel, ff.inner.bias,
                                        ff.outer.kernel, ff.outer.bias)]
  assert w1.shape == (D, d_ff) and w2.shape == (d_ff, D)  # not padded
  expected = np.maximum(0.0, x.numpy() @ w1 + b1) @ w2 + b2
  # Two float32 computations (TensorFlow's, NumPy's), each within the
  # layer's bound (rounding.py).
  _, bound = rounding.layer_bounds(ff, x.numpy())
  rounding.assert_within(ff(x).numpy().reshape(B, -1),
                         expected.reshape(B, -1), 2 * bound)


def test_inner_padding_is_one_cache_line_where_rows_alias():
  padding = layers.feed_forward.inner_padding
  assert [padding(1024, "float32"), padding(2048, "float32"),
          padding(1024, "bfloat16"), padding(4096, "float16")] == [16] * 2 + [
              32] * 2
  assert [padding(1000, "float32"), padding(200, "bfloat16"),
          padding(96, "float32")] == [0] * 3


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16, tf.float32])
def test_masked_softmax_is_safe_in_low_precision(dtype):
  scores = tf.cast(tf.constant([[3.0, 60000.0, -2.0], [1.0, 2.0, 3.0]]),
                   dtype)
  mask = tf.constant([[True, False, True], [False, False, False]])
  weights = tf.cast(masks.masked_softmax(scores, mask), tf.float32).numpy()
  assert np.all(np.isfinite(weights))
  assert weights[0, 1] == 0.0
  # A float32 softmax of 3 scores (each quotient within 2 FUNCTION + 5
  # roundings of itself: the exponential, 3 sums, the division), each
  # weight then rounded to `dtype` (within its u), summed here in float32
  # (2 roundings of the sum): within u of 1 and as many float32 roundings.
  u = rounding.U[dtype.name]
  float32 = (2 * rounding.FUNCTION + 7) * rounding.U32
  rounding.assert_within(weights.sum(-1), 1.0, u + float32)
  rounding.assert_within(weights[1], 1 / 3, (u + float32) / 3)  # uniform


def test_attention_ignores_padded_keys():
  mha = layers.MultiHeadAttention(num_heads=2, d_k=4)
  query, memory = _inputs([B, T, D]), _inputs([B, S, D], 1)
  key_mask = _padding([S, 3], S)
  before = mha(query, memory, masks.key_padding_mask(key_mask))
  changed = tf.where(key_mask[:, :, None], memory, 100.0 + memory)
  after = mha(query, changed, masks.key_padding_mask(key_mask))
  # The same function of the real keys: two computations, each within its
  # float32 bound (rounding.py).
  _, bound = rounding.layer_bounds(mha, {
      "query": query.numpy(), "value": memory.numpy(),
      "attention_mask": key_mask.numpy()})
  rounding.assert_within(after.numpy().reshape(B, -1),
                         before.numpy().reshape(B, -1), 2 * bound)
  # Unmasked, the same change shows past any rounding (the test can fail).
  unmasked = mha(query, changed)
  assert np.abs(unmasked - before).max() > 2 * bound.max()


def test_decoder_layer_cannot_see_the_future():
  layer = layers.DecoderLayer(num_heads=4, d_ff=32, dropout_rate=0.0)
  x, memory = _inputs([B, T, D]), _inputs([B, S, D], 1)
  before = layer(x, memory, masks.causal_mask(T))
  changed = tf.concat([x[:, :3], x[:, 3:] + 5.0], axis=1)
  after = layer(changed, memory, masks.causal_mask(T))
  # The first 3 positions: the same function of the same inputs, each
  # computation within its float32 bound (rounding.py).
  _, bound = rounding.layer_bounds(layer, {
      "x": x.numpy(), "memory": memory.numpy(),
      "self_attention_mask": np.broadcast_to(np.tril(np.ones([T, T], bool)),
                                             [B, 1, T, T]),
      "cross_attention_mask": np.ones([B, 1, 1, S], bool)})
  bound = bound.reshape(B, T, D)
  rounding.assert_within(after[:, :3], before[:, :3], 2 * bound[:, :3])
  assert np.abs(after[:, 3:] - before[:, 3:]).max() > 2 * bound.max()


def _sine_bound(angle):
  """A float32 sine or cosine of pos / 10000^(2i/d): the power within
  FUNCTION roundings and the quotient one more, so the angle within
  (FUNCTION + 2) u of itself; the sine FUNCTION u more, and its result's
  rounding."""
  return ((rounding.FUNCTION + 2) * abs(angle) + rounding.FUNCTION + 1) * (
      rounding.U32)


def test_sinusoid_matches_section_3_5():
  table = layers.embedding.sinusoid_table(tf.range(50), 8).numpy()
  for pos in (0, 7, 49):
    for i in range(4):
      angle = pos / 10000 ** (2 * i / 8)
      rounding.assert_within(table[pos, 2 * i], np.sin(angle),
                             _sine_bound(angle))
      rounding.assert_within(table[pos, 2 * i + 1], np.cos(angle),
                             _sine_bound(angle))
  # An offset start gives the same rows as the full table (decoding steps):
  # two computations of the same sines.
  layer = layers.SinusoidalPositionalEncoding()
  x = tf.zeros([1, 2, 8])
  angles = np.arange(7, 9)[:, None] / 10000 ** (
      2 * (np.arange(8) // 2) / 8)[None, :]
  rounding.assert_within(layer(x, start=7)[0], table[7:9],
                         2 * _sine_bound(angles))


def test_shared_embedding_scales_and_projects_with_one_matrix():
  embedding = layers.SharedEmbedding(vocab_size=6, d_model=4)
  vectors = embedding(tf.constant([[2]]))
  matrix = embedding.embeddings.numpy()
  # Exact: times sqrt(4) = 2 (a power of two), and a one-hot row's products
  # (x 1, x 0) and their sum.
  np.testing.assert_array_equal(vectors[0, 0], matrix[2] * 2.0)
  logits = embedding.logits(tf.constant([[[1.0, 0, 0, 0]]]))
  np.testing.assert_array_equal(logits[0, 0], matrix[:, 0])
  assert len(embedding.weights) == 1


def test_post_norm_is_the_default_and_pre_norm_differs():
  x, y = _inputs([B, T, D]), _inputs([B, T, D], 1)
  post = layers.ResidualNorm(dropout_rate=0.0)
  out = post(x, y).numpy()
  # LN(x + y), of mean 0 exactly: each output within its float32 bound
  # (rounding.py), their mean within the bounds' mean and NumPy's sum of D
  # terms (D - 1 roundings within the sum of their magnitudes).
  _, bound = rounding.layer_bounds(post, {"x": x.numpy(),
                                          "sublayer_output": y.numpy()})
  bound = bound.reshape(B, T, D).mean(-1) + (D - 1) * rounding.U32 * np.abs(
      out).mean(-1)
  rounding.assert_within(out.mean(-1), 0.0, bound)
  pre = layers.ResidualNorm(dropout_rate=0.0, norm_position="pre")
  np.testing.assert_array_equal(pre(x, y), x + y)  # one correctly rounded add


def test_a_sequence_past_the_learned_positions_gets_its_own_error():
  """A sequence longer than the learned table fails with the layer's
  message, never with the gather's own out-of-range error: a ValueError
  where the length is known when traced (eagerly, as every JAX call), and
  in a graph of unknown length when run (the gather waits for the check)."""
  embedding = layers.LearnedPositionalEmbedding(max_length=4)
  embedding(tf.zeros([1, 4, 8]))
  for call in (embedding, tf.function(embedding.call)):
    with pytest.raises(ValueError, match="longer than max_length=4"):
      call(tf.zeros([2, 6, 8]))
  graph_call = tf.function(embedding.call, input_signature=[
      tf.TensorSpec([None, None, 8], tf.float32)])
  np.testing.assert_array_equal(graph_call(tf.zeros([1, 4, 8])).shape,
                                [1, 4, 8])
  for _ in range(3):
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="longer than max_length=4"):
      graph_call(tf.zeros([2, 6, 8]))
