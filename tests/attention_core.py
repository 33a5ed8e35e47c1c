"""The attention core's two paths on one backend: the fused one
(`keras.ops.dot_product_attention`, taken when no weights are asked) and
the one that returns the weights, on the same inputs and weights. Imported
by tests/test_attention_core.py under TensorFlow and by test_backends.py's
checks under JAX and PyTorch; no TensorFlow here (the bounds they are held
to are computed under TensorFlow, tests/rounding.py, from the same weights,
which `write_weights` writes and `gaps` reads)."""

import os

import keras
import numpy as np

from tf_transformer import config as config_lib
from tf_transformer import model as model_lib
from tf_transformer.layers import MultiHeadAttention

SOURCE = np.array([[5, 6, 7, 2], [8, 9, 2, 0]], np.int32)
TARGET = np.array([[1, 5, 6], [1, 7, 0]], np.int32)


def inputs():
  """The attention cases' inputs: {case: call arguments (arrays)}."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=(3, 7, 32)).astype(np.float32)
  memory = rng.normal(size=(3, 5, 32)).astype(np.float32)
  lengths = np.array([7, 4, 1])
  real = np.arange(7)[None] < lengths[:, None]
  memory_real = np.arange(5)[None] < np.array([5, 2, 3])[:, None]
  causal = np.tril(np.ones((7, 7), bool))[None, None] & real[:, None, None]
  return {
      "padding": dict(query=x, attention_mask=real[:, None, None, :]),
      "causal": dict(query=x, attention_mask=causal),
      "cross": dict(query=x, value=memory,
                    attention_mask=memory_real[:, None, None, :]),
  }


def layers_of(folder=None):
  """(the attention layer, the tiny model), built; with the weights in
  `folder` (`write_weights`'s) if given."""
  keras.utils.set_random_seed(0)
  attention = MultiHeadAttention(num_heads=4, d_k=8)
  attention(**inputs()["cross"])
  model = model_lib.build_model(config_lib.get_config("tiny"))
  model((SOURCE, TARGET))
  if folder:
    saved = np.load(os.path.join(folder, "attention.npz"))
    attention.set_weights([saved[f"w{i}"] for i in range(len(saved))])
    model.load_weights(os.path.join(folder, "model.weights.h5"))
  return attention, model


def write_weights(folder):
  """Writes the layers' weights for `gaps` on other backends."""
  attention, model = layers_of()
  np.savez(os.path.join(folder, "attention.npz"),
           **{f"w{i}": w for i, w in enumerate(attention.get_weights())})
  model.save_weights(os.path.join(folder, "model.weights.h5"))


def gaps(folder=None):
  """{case: (fused output, output with weights)}, as nested lists, over
  self-attention with padding, causal self-attention with padding,
  cross-attention, and the tiny model's encoder output and logits."""
  numpy = keras.ops.convert_to_numpy
  attention, model = layers_of(folder)
  found = {}
  for name, arguments in inputs().items():
    fused = numpy(attention(**arguments))
    weighted, _ = attention(**arguments, return_attention_scores=True)
    found[name] = (fused.tolist(), numpy(weighted).tolist())
  memory, source_mask = model.encode(SOURCE)
  weighted_memory = model.encode(SOURCE, return_attention_scores=True)[0]
  found["encoder"] = (numpy(memory).tolist(), numpy(weighted_memory).tolist())
  logits = model.decode(TARGET, memory, source_mask)
  weighted_logits, _ = model.decode(TARGET, memory, source_mask,
                                    return_attention_scores=True)
  found["logits"] = (numpy(logits).tolist(), numpy(weighted_logits).tolist())
  return found
