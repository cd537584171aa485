"""T5X-compatible networks with a multi-token KV cache, and the protocol the loops see."""
from specjax.models.feature_head import FeatureHead, FeatureHeadConfig
from specjax.models.decoder_only import PROMPT_CONVENTIONS, DecoderOnlyConfig, DecoderOnlyModel
from specjax.models.gemma import GemmaModel, load_gemma
from specjax.models.gemma_config import GEMMA_SIZES, GemmaConfig
from specjax.models.layers import EncodedInputs, KVCache
from specjax.models.model_gin import (MODEL_GIN, config_from_model_file, model_gin_text,
                                      parse_model_file, read_model_gin)
from specjax.models.protocol import (DecodingModel, FeatureModel, LayerFeatureModel,
                                     check_same_vocab, eagle3_feature_layers)
from specjax.models.start import prefill, start_model
from specjax.models.t5 import T5Config, T5Model

__all__ = ["DecodingModel", "FeatureModel", "LayerFeatureModel", "eagle3_feature_layers",
           "FeatureHead", "FeatureHeadConfig", "check_same_vocab", "T5Config", "T5Model",
           "DecoderOnlyConfig", "DecoderOnlyModel", "GemmaConfig", "GemmaModel", "GEMMA_SIZES",
           "load_gemma", "PROMPT_CONVENTIONS", "KVCache",
           "EncodedInputs", "build_model", "start_model", "prefill", "MODEL_GIN", "model_gin_text",
           "read_model_gin", "parse_model_file", "config_from_model_file"]


def build_model(config):
  """T5Model for a T5Config, DecoderOnlyModel for a DecoderOnlyConfig, GemmaModel for a
  GemmaConfig."""
  if isinstance(config, GemmaConfig):
    return GemmaModel(config)
  if isinstance(config, T5Config):
    return T5Model(config)
  if isinstance(config, DecoderOnlyConfig):
    return DecoderOnlyModel(config)  # prefix LM as config.inputs_bidirectional_attention
  raise ValueError(f"model config must be a T5Config, DecoderOnlyConfig or GemmaConfig, got "
                   f"{type(config).__name__}")
