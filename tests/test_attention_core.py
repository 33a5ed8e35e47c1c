"""The attention core by `keras.ops.dot_product_attention` computes what
eq. 1 with returned weights does (issue: the attention core that GPUs
fuse); under JAX and PyTorch, test_backends.py runs the same check."""

import numpy as np
import pytest

import attention_core
import rounding

pytestmark = pytest.mark.numeric


def assert_gaps_within_rounding(found, folder=None):
  """`attention_core.gaps`' cases (computed here or by another backend on
  the weights in `folder`): both paths within their float32 bounds
  (rounding.py) of the exact outputs: the attention layer's on each case's
  inputs, the model's memory and logits at its real positions."""
  attention, model = attention_core.layers_of(folder)
  assert set(found) == {"padding", "causal", "cross", "encoder", "logits"}
  for case, arguments in attention_core.inputs().items():
    fused, weighted = (np.asarray(a) for a in found[case])
    _, bound = rounding.layer_bounds(attention, arguments)
    rounding.assert_within(fused.reshape(len(fused), -1),
                           weighted.reshape(len(fused), -1), 2 * bound, case)
  sources = rounding.unpadded(attention_core.SOURCE)
  _, bound = rounding.memory_bounds(model, sources)
  fused, weighted = (np.asarray(a) for a in found["encoder"])
  for row, source in enumerate(sources):
    rounding.assert_within(fused[row, :len(source)],
                           weighted[row, :len(source)],
                           2 * bound[row, :len(source)], "encoder")
  cells = [(row, t) for row, target in enumerate(attention_core.TARGET)
           for t in range(len(target)) if t == 0 or target[t]]
  _, bound = rounding.vocabulary_logit_bounds(
      model, [sources[row] for row, _ in cells],
      [list(attention_core.TARGET[row, 1:t + 1]) for row, t in cells])
  fused, weighted = (np.asarray(a) for a in found["logits"])
  rounding.assert_within(np.stack([fused[r, t] for r, t in cells]),
                         np.stack([weighted[r, t] for r, t in cells]),
                         2 * bound, "logits")


def test_the_fused_core_equals_the_core_that_returns_weights():
  """Self-attention over padding, causal self-attention, cross-attention,
  the tiny model's encoder and logits: both paths sum the same products of
  d_k = 8 (16 in the model) terms, one scaling the query and the other the
  scores, so they differ by float32 rounding."""
  assert_gaps_within_rounding(attention_core.gaps())
