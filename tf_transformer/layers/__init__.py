"""Public, serializable Keras layers of the Transformer (sections 3.1-3.5),
written in `keras.ops`: they run on every Keras 3 backend (docs/model.md,
"Backends")."""

from tf_transformer.layers.attention import MultiHeadAttention
from tf_transformer.layers.attention import ScaledDotProductAttention
from tf_transformer.layers.attention import scaled_dot_product_attention
from tf_transformer.layers.decoder import Decoder
from tf_transformer.layers.decoder import DecoderLayer
from tf_transformer.layers.embedding import LearnedPositionalEmbedding
from tf_transformer.layers.embedding import SharedEmbedding
from tf_transformer.layers.embedding import SinusoidalPositionalEncoding
from tf_transformer.layers.embedding import positional_encoding
from tf_transformer.layers.encoder import Encoder
from tf_transformer.layers.encoder import EncoderLayer
from tf_transformer.layers.feed_forward import PositionwiseFeedForward
from tf_transformer.layers.residual import ResidualNorm
from tf_transformer.layers import masks

__all__ = [
    "Decoder", "DecoderLayer", "Encoder", "EncoderLayer",
    "LearnedPositionalEmbedding", "MultiHeadAttention",
    "PositionwiseFeedForward", "ResidualNorm", "ScaledDotProductAttention",
    "SharedEmbedding", "SinusoidalPositionalEncoding", "masks",
    "positional_encoding", "scaled_dot_product_attention",
]
