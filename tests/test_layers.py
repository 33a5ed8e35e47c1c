"""The layers' maths: eq. 1 and 2, positions, masks and embeddings. (Every
public layer's Keras conventions, serialization to XLA and dtype policies,
are tests/test_layer_conventions.py's.)"""

import numpy as np
import pytest
import tensorflow as tf

from tf_transformer import layers
from tf_transformer.layers import masks
from float32_bounds import RELATIVE

B, T, S, D = 2, 5, 7, 16


def _inputs(shape, seed=0):
  return tf.random.stateless_normal(shape, [seed, 1])


def _padding(lengths, length):
  return tf.sequence_mask(lengths, length)


def test_attention_is_equation_1():
  q, k, v = _inputs([1, 1, 3, 4]), _inputs([1, 1, 5, 4], 1), _inputs(
      [1, 1, 5, 2], 2)
  output, weights = layers.scaled_dot_product_attention(q, k, v)
  scores = (q.numpy()[0, 0] @ k.numpy()[0, 0].T) / np.sqrt(4)
  expected = np.exp(scores - scores.max(-1, keepdims=True))
  expected /= expected.sum(-1, keepdims=True)
  np.testing.assert_allclose(weights[0, 0], expected, rtol=1e-5)
  # Each output a sum of 5 terms summed in other orders by TensorFlow's
  # kernels and NumPy's: within RELATIVE of the terms' magnitudes (one
  # output here is 16 times smaller than its terms).
  terms = np.abs(expected) @ np.abs(v.numpy()[0, 0])
  assert np.all(np.abs(output[0, 0] - expected @ v.numpy()[0, 0]) <=
                RELATIVE * terms)


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
  np.testing.assert_allclose(ff(x), expected, rtol=1e-4, atol=1e-4)


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
  np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-2)
  np.testing.assert_allclose(weights[1], 1 / 3, rtol=1e-2)  # no key: uniform


def test_attention_ignores_padded_keys():
  mha = layers.MultiHeadAttention(num_heads=2, d_k=4)
  query, memory = _inputs([B, T, D]), _inputs([B, S, D], 1)
  key_mask = _padding([S, 3], S)
  before = mha(query, memory, masks.key_padding_mask(key_mask))
  changed = tf.where(key_mask[:, :, None], memory, 100.0 + memory)
  after = mha(query, changed, masks.key_padding_mask(key_mask))
  np.testing.assert_allclose(after, before, atol=1e-5)
  unmasked = mha(query, changed)
  assert not np.allclose(unmasked, before, atol=1e-3)


def test_decoder_layer_cannot_see_the_future():
  layer = layers.DecoderLayer(num_heads=4, d_ff=32, dropout_rate=0.0)
  x, memory = _inputs([B, T, D]), _inputs([B, S, D], 1)
  before = layer(x, memory, masks.causal_mask(T))
  changed = tf.concat([x[:, :3], x[:, 3:] + 5.0], axis=1)
  after = layer(changed, memory, masks.causal_mask(T))
  np.testing.assert_allclose(after[:, :3], before[:, :3], atol=1e-5)
  assert not np.allclose(after[:, 3:], before[:, 3:], atol=1e-3)


def test_sinusoid_matches_section_3_5():
  table = layers.embedding.sinusoid_table(tf.range(50), 8).numpy()
  for pos in (0, 7, 49):
    for i in range(4):
      angle = pos / 10000 ** (2 * i / 8)
      np.testing.assert_allclose(table[pos, 2 * i], np.sin(angle), atol=1e-5)
      np.testing.assert_allclose(table[pos, 2 * i + 1], np.cos(angle),
                                 atol=1e-5)
  # An offset start gives the same rows as the full table (decoding steps).
  layer = layers.SinusoidalPositionalEncoding()
  x = tf.zeros([1, 2, 8])
  np.testing.assert_allclose(layer(x, start=7)[0], table[7:9], atol=1e-6)


def test_shared_embedding_scales_and_projects_with_one_matrix():
  embedding = layers.SharedEmbedding(vocab_size=6, d_model=4)
  vectors = embedding(tf.constant([[2]]))
  matrix = embedding.embeddings.numpy()
  np.testing.assert_allclose(vectors[0, 0], matrix[2] * 2.0, rtol=1e-6)
  logits = embedding.logits(tf.constant([[[1.0, 0, 0, 0]]]))
  np.testing.assert_allclose(logits[0, 0], matrix[:, 0], rtol=1e-6)
  assert len(embedding.weights) == 1


def test_post_norm_is_the_default_and_pre_norm_differs():
  x, y = _inputs([B, T, D]), _inputs([B, T, D], 1)
  post = layers.ResidualNorm(dropout_rate=0.0)
  out = post(x, y).numpy()
  np.testing.assert_allclose(out.mean(-1), 0.0, atol=1e-4)  # LN(x + y)
  pre = layers.ResidualNorm(dropout_rate=0.0, norm_position="pre")
  np.testing.assert_allclose(pre(x, y), x + y, atol=1e-6)


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
