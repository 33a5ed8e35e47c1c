"""Embeddings and positional encodings (sections 3.4 and 3.5).

`SharedEmbedding` is the one weight matrix that the paper shares between the
source embedding, the target embedding and the pre-softmax linear
transformation; lookups are multiplied by sqrt(d_model). The positional layers
return their input plus the encoding of positions start..start+length-1, so a
decoder step at position `start` gets the same encoding as the full pass.
Written with `keras.ops`, so they run on every Keras backend.
"""

import math

import keras

from tf_transformer.layers.policy import PolicyLayer

SINUSOIDAL = ("sinusoidal", "sinusoidal_halves", "sinusoidal_opennmt")


@keras.saving.register_keras_serializable(package="tf_transformer")
class SharedEmbedding(PolicyLayer):
  """Token embedding whose transpose is also the output projection
  (section 3.4): one matrix for the source, the target and the pre-softmax
  linear transformation.

  Args:
    vocab_size: rows of the matrix, the shared vocabulary's size.
    d_model: the model width.
    scale: multiply looked-up embeddings by sqrt(d_model), as the paper does.
  """

  def __init__(self, vocab_size, d_model, scale=True, **kwargs):
    super().__init__(**kwargs)
    self.vocab_size = vocab_size
    self.d_model = d_model
    self.scale = scale

  def build(self, ids_shape=None):
    # N(0, d_model^-0.5): after the sqrt(d_model) scaling, lookups have unit
    # variance, like the positional encodings they are added to. Read in
    # its own dtype (no autocast): `call` and `logits` cast what they use.
    self.embeddings = self.add_weight(
        name="embeddings", shape=(self.vocab_size, self.d_model),
        initializer=keras.initializers.RandomNormal(stddev=self.d_model**-0.5),
        autocast=False)

  def call(self, ids):
    """Args:
      ids: int token ids, any shape.
    Returns:
      [..., d_model] embeddings in the compute dtype, times sqrt(d_model)
      with `scale`.

    The rows are gathered from the table in its variable dtype and then
    cast, rather than gathered from a cast table: the same values, but the
    gradient's scatter-add into the table runs in the variable dtype. A
    scatter-add into a bfloat16 copy rounds each repeated token's sum to 8
    bits and, compiled for a GPU, serializes on 16-bit atomic adds.
    """
    x = keras.ops.cast(keras.ops.take(self.embeddings, ids, axis=0),
                       self.compute_dtype)
    return x * self.multiplier if self.scale else x

  def logits(self, x):
    """The pre-softmax linear transformation, x E^T (section 3.4).

    One 2-D matmul over all positions: a [batch, length, d] times [d, vocab]
    batched matmul would broadcast into a batch of small matmuls whose
    gradient materialises [batch, vocab, d] before summing.

    Args:
      x: [..., d_model] decoder outputs.
    Returns:
      [..., vocab_size] logits, in x's dtype.
    """
    flat = keras.ops.reshape(x, (-1, self.d_model))
    logits = keras.ops.matmul(flat, keras.ops.transpose(
        keras.ops.cast(self.embeddings, x.dtype)))
    return keras.ops.reshape(
        logits, tuple(keras.ops.shape(x)[:-1]) + (self.vocab_size,))

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


def sinusoid_table(positions, d_model, dtype="float32", kind="sinusoidal"):
  """The sinusoidal encodings of section 3.5:
  PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(...).

  Args:
    positions: [length] positions from 0 (any number type).
    d_model: the model width.
    dtype: the table's dtype.
    kind: the layout (config.POSITIONAL_ENCODINGS): "sinusoidal", sin and
      cos interleaved as in the paper; "sinusoidal_halves", the same sines
      in the first half of the dimensions and the same cosines in the
      second (Transformers' and CTranslate2's Marian models);
      "sinusoidal_opennmt", [sin | cos] of position + 1 with frequencies
      10000^(-i/(d_model/2 - 1)), as OpenNMT-tf's SinusoidalPositionEncoder
      (tensor2tensor's spacing).
  Returns:
    [length, d_model].
  """
  ops = keras.ops
  positions = ops.cast(positions, "float32")[:, None]
  if kind == "sinusoidal_opennmt":
    increment = math.log(10000.0) / (d_model / 2 - 1)
    frequencies = ops.exp(ops.arange(d_model // 2, dtype="float32")
                          * -increment)
    angles = (positions + 1.0) * frequencies
    return ops.cast(ops.concatenate([ops.sin(angles), ops.cos(angles)],
                                    axis=-1), dtype)
  two_i = ops.arange(0, d_model, 2, dtype="float32")
  angles = positions / ops.power(10000.0, two_i / d_model)
  if kind == "sinusoidal_halves":
    table = ops.concatenate([ops.sin(angles),
                             ops.cos(angles[:, :d_model // 2])], axis=-1)
  else:
    table = ops.reshape(ops.stack([ops.sin(angles), ops.cos(angles)], -1),
                        (-1, 2 * ((d_model + 1) // 2)))[:, :d_model]
  return ops.cast(table, dtype)


@keras.saving.register_keras_serializable(package="tf_transformer")
class SinusoidalPositionalEncoding(PolicyLayer):
  """Adds the fixed sinusoidal encoding of section 3.5 (no weights, any
  length).

  Args:
    kind: the layout, "sinusoidal", "sinusoidal_halves" or
      "sinusoidal_opennmt" (`sinusoid_table`).
    halves: True reads as kind="sinusoidal_halves" (configs saved before
      `kind`).
  """

  def __init__(self, halves=False, kind=None, **kwargs):
    super().__init__(**kwargs)
    self.kind = kind or ("sinusoidal_halves" if halves else "sinusoidal")

  def call(self, inputs, start=0):
    """Args:
      inputs: [batch, length, d_model] embeddings.
      start: the first position (a decoding step's).
    Returns:
      inputs + PE[start:start + length].
    """
    positions = start + keras.ops.arange(keras.ops.shape(inputs)[1])
    return inputs + sinusoid_table(positions, inputs.shape[-1], inputs.dtype,
                                   self.kind)

  def named_weights(self):
    """None: no table, the sinusoids of any position (`sinusoid_table`)."""
    return None

  def get_config(self):
    return {**super().get_config(), "kind": self.kind}


@keras.saving.register_keras_serializable(package="tf_transformer")
class LearnedPositionalEmbedding(PolicyLayer):
  """Adds a learned position embedding (Table 3 row E).

  Args:
    max_length: rows of the table; a longer input is an error.
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
    """Args:
      inputs: [batch, length, d_model] embeddings.
      start: the first position (a decoding step's).
    Returns:
      inputs + P[start:start + length]; past `max_length` a ValueError
      where the length and start are known when traced (every JAX and
      PyTorch call with an int start), else, under TensorFlow, its
      InvalidArgumentError when run.
    """
    length = keras.ops.shape(inputs)[1]
    positions = start + keras.ops.arange(length)
    message = (f"sequence longer than max_length={self.max_length} of the "
               "learned positional embedding")
    if isinstance(length, int) and isinstance(start, int):
      if start + length > self.max_length:
        raise ValueError(message)
    elif keras.backend.backend() == "tensorflow":
      positions = _checked_positions(positions, self.max_length, message)
    return inputs + keras.ops.take(
        keras.ops.cast(self.position_embeddings, inputs.dtype), positions,
        axis=0)

  def named_weights(self):
    """The table [max_length, d_model]."""
    return self.position_embeddings

  def get_config(self):
    return {**super().get_config(), "max_length": self.max_length}


def _checked_positions(positions, max_length, message):
  """`positions` once a run-time check finds them below `max_length`.

  Only a TensorFlow graph leaves the length unknown until run time; there
  the gather waits for the check, or its own out-of-range error may come
  first.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  check = tf.debugging.assert_less(positions[-1:], max_length,
                                   message=message)
  with tf.control_dependencies([check]):
    return tf.identity(positions)


def positional_encoding(kind, max_length, name="positional_encoding",
                        dtype=None):
  """The positional layer of a config (section 3.5, Table 3 row E).

  Args:
    kind: "learned", or a sinusoidal layout of `sinusoid_table`
      (config.POSITIONAL_ENCODINGS).
    max_length: the learned table's rows.
    name, dtype: the layer's.
  Returns:
    A `SinusoidalPositionalEncoding` or a `LearnedPositionalEmbedding`.
  """
  if kind in SINUSOIDAL:
    return SinusoidalPositionalEncoding(kind=kind, name=name, dtype=dtype)
  if kind == "learned":
    return LearnedPositionalEmbedding(max_length, name=name, dtype=dtype)
  raise ValueError(f"positional_encoding={kind!r}: expected one of "
                   f"{SINUSOIDAL + ('learned',)}")
