"""The dtype policy of every public layer (Keras 3 mixed precision).

A layer given `dtype="mixed_bfloat16"` (or "mixed_float16", "bfloat16", or
none: the global policy) computes in the policy's compute dtype and keeps its
weights in the variable dtype; every layer it creates gets the same policy
(`dtype=self.dtype_policy`), so one policy reaches every matmul. Where half
precision is not safe the arithmetic runs in float32 inside the layer: the
attention softmax (`masks.masked_softmax`), layer normalization (Keras'
`LayerNormalization` does) and the logits at the loss and the search
(`Transformer.decode`).

`PolicyLayer` adds what `keras.layers.Layer` leaves out: its
`compute_output_spec`, called directly rather than through `__call__`,
traces `call` with the inputs as given, so a float32 spec came back from a
bfloat16 layer. It casts floating inputs as `__call__` does first.
"""

import keras


class PolicyLayer(keras.layers.Layer):
  """A Keras layer whose output spec is in its compute dtype."""

  def compute_output_spec(self, *args, **kwargs):
    convert = lambda x: self.dtype_policy.convert_input(x, self.autocast,
                                                        self.input_dtype)
    return super().compute_output_spec(
        *keras.tree.map_structure(convert, args),
        **keras.tree.map_structure(convert, kwargs))
