"""Embeddings and positional encodings (sections 3.4 and 3.5).

`SharedEmbedding` is the one weight matrix that the paper shares between the
source embedding, the target embedding and the pre-softmax linear
transformation; lookups are multiplied by sqrt(d_model). The positional layers
return their input plus the encoding of positions start..start+length-1, so a
decoder step at position `start` gets the same encoding as the full pass.
"""

import math

import keras
import tensorflow as tf

from tf_transformer.layers.policy import PolicyLayer


@keras.saving.register_keras_serializable(package="tf_transformer")
class SharedEmbedding(PolicyLayer):
  """Token embedding whose transpose is also the output projection (3.4).

  `call(ids)` -> [..., d_model] embeddings times sqrt(d_model);
  `logits(x)` -> x E^T, the pre-softmax logits over the vocabulary.
  """

  def __init__(self, vocab_size, d_model, scale=True, **kwargs):
    super().__init__(**kwargs)
    self.vocab_size = vocab_size
    self.d_model = d_model
    self.scale = scale

  def build(self, ids_shape=None):
    # N(0, d_model^-0.5): after the sqrt(d_model) scaling, lookups have unit
    # variance, like the positional encodings they are added to.
    self.embeddings = self.add_weight(
        name="embeddings", shape=(self.vocab_size, self.d_model),
        initializer=keras.initializers.RandomNormal(stddev=self.d_model**-0.5))

  def call(self, ids):
    x = tf.gather(tf.cast(self.embeddings, self.compute_dtype), ids)
    return x * self.multiplier if self.scale else x

  def logits(self, x):
    """The pre-softmax linear transformation: x times the embedding's
    transpose, as one 2-D matmul over all positions. (A [batch, length, d]
    times [d, vocab] tf.matmul broadcasts into a batch of small matmuls, and
    its gradient materialises [batch, vocab, d] before summing: gigabytes at
    the paper's vocabulary.)"""
    flat = tf.reshape(x, [-1, self.d_model])
    logits = tf.matmul(flat, tf.cast(self.embeddings, x.dtype),
                       transpose_b=True)
    return tf.reshape(logits, tf.concat(
        [tf.shape(x)[:-1], [self.vocab_size]], axis=0))

  def named_weights(self):
    """The embedding matrix [vocab_size, d_model] (`named_weights.Model`)."""
    return self.embeddings

  @property
  def multiplier(self):
    """What lookups are multiplied by: sqrt(d_model) (3.4), or 1."""
    return math.sqrt(self.d_model) if self.scale else 1.0

  def compute_output_spec(self, ids):
    return keras.KerasTensor(tuple(ids.shape) + (self.d_model,),
                             dtype=self.compute_dtype)

  def get_config(self):
    return {**super().get_config(), "vocab_size": self.vocab_size,
            "d_model": self.d_model, "scale": self.scale}


def sinusoid_table(positions, d_model, dtype=tf.float32):
  """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(...)."""
  positions = tf.cast(positions, tf.float32)[:, tf.newaxis]
  two_i = tf.range(0, d_model, 2, dtype=tf.float32)
  angles = positions / tf.pow(10000.0, two_i / d_model)
  # Interleave sin (even dimensions) and cos (odd dimensions) as in the paper.
  table = tf.reshape(tf.stack([tf.sin(angles), tf.cos(angles)], axis=-1),
                     [-1, 2 * two_i.shape[0]])[:, :d_model]
  return tf.cast(table, dtype)


@keras.saving.register_keras_serializable(package="tf_transformer")
class SinusoidalPositionalEncoding(PolicyLayer):
  """Adds the fixed sinusoidal encoding of section 3.5 (no weights, any length).

  `call(x, start=0)`: x is [batch, length, d_model]; returns x + PE[start:start+length].
  """

  def call(self, inputs, start=0):
    positions = start + tf.range(tf.shape(inputs)[1])
    return inputs + sinusoid_table(positions, inputs.shape[-1], inputs.dtype)

  def named_weights(self):
    """None: no table, the sinusoids of any position (`sinusoid_table`)."""
    return None


@keras.saving.register_keras_serializable(package="tf_transformer")
class LearnedPositionalEmbedding(PolicyLayer):
  """Adds a learned position embedding (Table 3 row E), up to `max_length`.

  `call(x, start=0)`: x is [batch, length, d_model]; returns x + P[start:start+length].
  """

  def __init__(self, max_length, **kwargs):
    super().__init__(**kwargs)
    self.max_length = max_length

  def build(self, inputs_shape, start_shape=None):
    d_model = inputs_shape[-1]
    self.position_embeddings = self.add_weight(
        name="position_embeddings", shape=(self.max_length, d_model),
        initializer=keras.initializers.RandomNormal(stddev=d_model**-0.5))

  def call(self, inputs, start=0):
    positions = start + tf.range(tf.shape(inputs)[1])
    check = tf.debugging.assert_less(
        positions[-1:], self.max_length,
        message=f"sequence longer than max_length={self.max_length} of the "
        "learned positional embedding")
    # In a graph the gather waits for the check: otherwise its own
    # out-of-range error may come first.
    with tf.control_dependencies([check]):
      positions = tf.identity(positions)
    return inputs + tf.gather(
        tf.cast(self.position_embeddings, inputs.dtype), positions)

  def named_weights(self):
    """The table [max_length, d_model]."""
    return self.position_embeddings

  def get_config(self):
    return {**super().get_config(), "max_length": self.max_length}


def positional_encoding(kind, max_length, name="positional_encoding",
                        dtype=None):
  """The positional layer of a config: "sinusoidal" or "learned"."""
  if kind == "sinusoidal":
    return SinusoidalPositionalEncoding(name=name, dtype=dtype)
  if kind == "learned":
    return LearnedPositionalEmbedding(max_length, name=name, dtype=dtype)
  raise ValueError(f"positional_encoding={kind!r}: expected 'sinusoidal' or "
                   "'learned'")
