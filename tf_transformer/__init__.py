"""tf_transformer: the Transformer of "Attention Is All You Need" (Vaswani et
al., 2017) in TensorFlow and Keras 3."""

import os

# oneDNN's CPU kernels: TensorFlow turns them on by default only on some
# CPUs, and where it leaves them off they give up to twice the fp32 matmul
# rate (docs/performance.md). Read when TensorFlow is first imported, so set
# before it; an explicit TF_ENABLE_ONEDNN_OPTS=0 still turns them off.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

# pylint: disable=g-import-not-at-top,wrong-import-position
from tf_transformer.config import PRESETS
from tf_transformer.config import TransformerConfig
from tf_transformer.config import get_config

__version__ = "1.1.0.dev0"


def __getattr__(name):
  """`Transformer`, `build_model`, `open_translator` and `open_scorer`
  import TensorFlow on first use, so that `tf_transformer.command` can
  quiet TensorFlow's start-up before it loads."""
  if name in ("Transformer", "build_model"):
    from tf_transformer import model
    return getattr(model, name)
  if name in ("open_translator", "open_scorer"):
    from tf_transformer.run import runner
    return getattr(runner, name)
  raise AttributeError(f"module 'tf_transformer' has no attribute {name!r}")


__all__ = ["PRESETS", "Transformer", "TransformerConfig", "build_model",
           "get_config", "open_scorer", "open_translator"]
