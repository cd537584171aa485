"""T5X-compatible networks with a multi-token KV cache."""
from specjax.models.protocol import DecodingModel, check_same_vocab

__all__ = ["DecodingModel", "check_same_vocab"]
