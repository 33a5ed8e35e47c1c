"""The attention core by `keras.ops.dot_product_attention` computes what
eq. 1 with returned weights does (issue: the attention core that GPUs
fuse); under JAX and PyTorch, test_backends.py runs the same check."""

from attention_core import gaps
from float32_bounds import RELATIVE


def test_the_fused_core_equals_the_core_that_returns_weights():
  """Self-attention over padding, causal self-attention, cross-attention,
  the tiny model's encoder and logits: both paths sum the same products of
  d_k = 8 (16 in the model) terms, one scaling the query and the other the
  scores, so they differ by float32 rounding: within RELATIVE (1e-5) of
  each output's magnitude."""
  for case, (gap, magnitude) in gaps().items():
    assert gap <= RELATIVE * max(magnitude, 1.0), (case, gap, magnitude)
