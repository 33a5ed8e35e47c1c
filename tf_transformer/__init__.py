"""tf_transformer: the Transformer of "Attention Is All You Need" (Vaswani et
al., 2017) in TensorFlow and Keras 3."""

from tf_transformer.config import PRESETS
from tf_transformer.config import TransformerConfig
from tf_transformer.config import get_config
from tf_transformer.model import Transformer
from tf_transformer.model import build_model

__version__ = "0.1.0"

__all__ = ["PRESETS", "Transformer", "TransformerConfig", "build_model",
           "get_config"]
