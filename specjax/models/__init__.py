"""T5X-compatible networks with a multi-token KV cache."""
from specjax.models.decoder_only import DecoderOnlyConfig, DecoderOnlyModel
from specjax.models.layers import EncodedInputs, KVCache
from specjax.models.protocol import DecodingModel, check_same_vocab
from specjax.models.t5 import T5Config, T5Model

__all__ = ["DecodingModel", "check_same_vocab", "T5Config", "T5Model",
           "DecoderOnlyConfig", "DecoderOnlyModel", "KVCache", "EncodedInputs"]
