"""Config keys that layers no longer take, so that a `.keras` file saved
with them still loads."""

# Each changed how a layer computed, never what: `fused` / `fused_attention`
# (eq. 1 by `keras.ops.dot_product_attention`), `pad_inner` (W_1 and W_2
# padded by zero units) and `xla_attention` (eq. 1 compiled by XLA on its
# own) gave the same outputs to float32 rounding.
RETIRED = ("fused", "fused_attention", "pad_inner", "xla_attention")


def without_retired(config):
  """`config` without the keys of `RETIRED`.

  Args:
    config: a layer's config, as `get_config` of any release wrote it.
  Returns:
    A copy without them.
  """
  return {k: v for k, v in config.items() if k not in RETIRED}
