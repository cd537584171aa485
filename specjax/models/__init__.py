"""T5X-compatible networks with a multi-token KV cache."""
from specjax.models.decoder_only import DecoderOnlyConfig, DecoderOnlyModel
from specjax.models.layers import EncodedInputs, KVCache
from specjax.models.protocol import DecodingModel, check_same_vocab
from specjax.models.t5 import T5Config, T5Model

__all__ = ["DecodingModel", "check_same_vocab", "T5Config", "T5Model",
           "DecoderOnlyConfig", "DecoderOnlyModel", "KVCache", "EncodedInputs", "build_model"]


def build_model(config):
  """T5Model for a T5Config, DecoderOnlyModel for a DecoderOnlyConfig."""
  if isinstance(config, T5Config):
    return T5Model(config)
  if isinstance(config, DecoderOnlyConfig):
    return DecoderOnlyModel(config)
  raise ValueError(f"model config must be a T5Config or DecoderOnlyConfig, got "
                   f"{type(config).__name__}")
