"""The attention core's two paths on one backend: the fused one
(`keras.ops.dot_product_attention`, taken when no weights are asked) and
the one that returns the weights, on the same inputs and weights. Imported
by tests/test_attention_core.py under TensorFlow and by test_backends.py's
checks under JAX and PyTorch; no TensorFlow here."""

import keras
import numpy as np

from tf_transformer import config as config_lib
from tf_transformer import model as model_lib
from tf_transformer.layers import MultiHeadAttention
from tf_transformer.layers import masks


def gaps():
  """{case: (largest |fused - with weights|, largest |output|)} over
  self-attention with padding, causal self-attention with padding,
  cross-attention, and the tiny model's encoder output and logits."""
  numpy = keras.ops.convert_to_numpy
  keras.utils.set_random_seed(0)
  rng = np.random.default_rng(0)
  x = rng.normal(size=(3, 7, 32)).astype(np.float32)
  memory = rng.normal(size=(3, 5, 32)).astype(np.float32)
  lengths = np.array([7, 4, 1])
  real = np.arange(7)[None] < lengths[:, None]
  memory_real = np.arange(5)[None] < np.array([5, 2, 3])[:, None]
  attention = MultiHeadAttention(num_heads=4, d_k=8)
  cases = {
      "padding": dict(query=x, attention_mask=masks.key_padding_mask(real)),
      "causal": dict(query=x,
                     attention_mask=masks.causal_padding_mask(real)),
      "cross": dict(query=x, value=memory,
                    attention_mask=masks.key_padding_mask(memory_real)),
  }
  found = {}
  for name, arguments in cases.items():
    fused = numpy(attention(**arguments))
    weighted, _ = attention(**arguments, return_attention_scores=True)
    found[name] = _gap(fused, numpy(weighted))

  model = model_lib.build_model(config_lib.get_config("tiny"))
  source = np.array([[5, 6, 7, 2], [8, 9, 2, 0]], np.int32)
  target = np.array([[1, 5, 6], [1, 7, 0]], np.int32)
  memory, source_mask = model.encode(source)
  weighted_memory = model.encode(source, return_attention_scores=True)[0]
  found["encoder"] = _gap(numpy(memory), numpy(weighted_memory))
  logits = model.decode(target, memory, source_mask)
  weighted_logits, _ = model.decode(target, memory, source_mask,
                                    return_attention_scores=True)
  found["logits"] = _gap(numpy(logits), numpy(weighted_logits))
  return found


def _gap(a, b):
  return float(np.abs(a - b).max()), float(np.abs(b).max())
