"""`GemmaConfig`: the sizes of a Gemma 2 / Gemma 3 text decoder, with the field names of the
gemma library's `gm.nn.config.TransformerConfig`, and the published sizes.

The config is plain data (strings for the library's enums), so it is hashable, written as a
model gin file and read back by the restricted parser, and built without the gemma package;
`GemmaConfig.of` converts the library's own configs (`gm.nn.Gemma3_270M`, an instance, or its
`TransformerConfig`) by reading their fields by name.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Tuple

from specjax.checks import check_bool, check_choice, check_int
from specjax.models.layers import DTYPES

LOCAL, GLOBAL = "local_sliding", "global"
ATTENTION_TYPES = {LOCAL: "sliding-window attention over the last sliding_window_size positions",
                   GLOBAL: "attention over every earlier position"}
"""Values of `GemmaConfig.attention_types` (the library's `AttentionType` names, lower case)."""
QUERY_NORMS = {
    "by_one_over_sqrt_head_dim": "queries times head_dim ** -0.5",
    "by_embed_dim_div_num_heads": "queries times embed_dim // num_heads",
    "by_one_over_sqrt_embed_dim_div_num_heads": "queries times (embed_dim // num_heads) ** -0.5",
}
"""Values of `GemmaConfig.query_pre_attn_norm` (the library's `QueryPreAttentionNormalisation`)."""


@dataclasses.dataclass(frozen=True)
class GemmaConfig:
  """A Gemma 2 / Gemma 3 text decoder (field names of the gemma library's TransformerConfig)."""
  num_embed: int
  """Vocabulary size V: rows of the tied embedding, size of the logits (Gemma 3: 262,144)."""
  embed_dim: int
  """Width E of the residual stream."""
  hidden_dim: int
  """Hidden width of the gated MLP."""
  num_heads: int
  """Query heads N."""
  head_dim: int
  """Width H of each head."""
  num_kv_heads: int
  """Key/value heads K (N a multiple of K; K < N is grouped-query attention, K = 1 multi-query)."""
  attention_types: Tuple[str, ...]
  """One of ATTENTION_TYPES per layer; with `num_layers` set, the pattern repeated to that many
  layers (the library's `make_attention_layers_types`)."""
  final_logit_softcap: Optional[float] = None
  """Gemma 2: logits = c * tanh(logits / c); None: no soft cap."""
  use_post_attn_norm: bool = True
  """An RMS norm on the attention output before its residual add."""
  use_post_ffw_norm: bool = True
  """An RMS norm on the MLP output before its residual add."""
  query_pre_attn_norm: str = "by_one_over_sqrt_head_dim"
  """How queries are scaled before the scores (QUERY_NORMS)."""
  attn_logits_soft_cap: Optional[float] = None
  """Gemma 2: attention scores = c * tanh(scores / c) before the mask; None: no cap."""
  sliding_window_size: Optional[int] = None
  """W of local layers: the query at position p sees keys at positions p - W + 1 .. p."""
  transpose_gating_einsum: bool = False
  """The MLP's `gating_einsum` is stored [2, hidden_dim, embed_dim] (else [2, embed_dim,
  hidden_dim])."""
  use_qk_norm: bool = False
  """Gemma 3: an RMS norm over each query and key head (`_query_norm`, `_key_norm`)."""
  local_base_frequency: int = 10_000
  """RoPE base frequency of local layers."""
  global_base_frequency: int = 10_000
  """RoPE base frequency of global layers (Gemma 3: 1,000,000)."""
  local_scale_factor: float = 1.0
  """RoPE position interpolation of local layers (angles divided by it; >= 1)."""
  global_scale_factor: float = 1.0
  """RoPE position interpolation of global layers (Gemma 3 4B and up: 8)."""
  num_layers: Optional[int] = None
  """Layers; None: len(attention_types). Not a field of the library's config (it derives it)."""
  dtype: str = "float32"
  """Activation, compute and cache dtype (specjax's; parameters keep their stored dtype)."""

  def __post_init__(self):
    name = type(self).__name__
    for field in ("num_embed", "embed_dim", "hidden_dim", "num_heads", "head_dim",
                  "num_kv_heads"):
      check_int(f"{name}.{field}", getattr(self, field), low=1, expected="a positive integer")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"{name}: num_heads={self.num_heads} is not a multiple of "
                       f"num_kv_heads={self.num_kv_heads}")
    if self.head_dim % 2:
      raise ValueError(f"{name}.head_dim must be even (RoPE rotates pairs), got {self.head_dim}")
    types = self.attention_types
    if isinstance(types, str) or not isinstance(types, (tuple, list)) or not types:
      raise ValueError(f"{name}.attention_types must be a non-empty tuple of "
                       f"{sorted(ATTENTION_TYPES)}, got {types!r}")
    types = tuple(str(getattr(t, "name", t)).lower() for t in types)
    for t in types:
      check_choice(f"{name}.attention_types", t, ATTENTION_TYPES)
    if self.num_layers is not None:
      check_int(f"{name}.num_layers", self.num_layers, low=1, expected="a positive integer")
      types = tuple(types[i % len(types)] for i in range(self.num_layers))
    object.__setattr__(self, "attention_types", types)
    object.__setattr__(self, "num_layers", len(types))
    norm = str(getattr(self.query_pre_attn_norm, "name", self.query_pre_attn_norm)).lower()
    check_choice(f"{name}.query_pre_attn_norm", norm, QUERY_NORMS)
    object.__setattr__(self, "query_pre_attn_norm", norm)
    if LOCAL in types:
      check_int(f"{name}.sliding_window_size", self.sliding_window_size, low=1,
                expected="a positive integer (the config has local_sliding layers)")
    for field in ("final_logit_softcap", "attn_logits_soft_cap"):
      value = getattr(self, field)
      if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                or not value > 0):
        raise ValueError(f"{name}.{field} must be None or a positive number, got {value!r}")
    for field in ("local_scale_factor", "global_scale_factor"):
      value = getattr(self, field)
      if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 1:
        raise ValueError(f"{name}.{field} must be a number >= 1, got {value!r}")
    for field in ("local_base_frequency", "global_base_frequency"):
      check_int(f"{name}.{field}", getattr(self, field), low=1, expected="a positive integer")
    for field in ("use_post_attn_norm", "use_post_ffw_norm", "transpose_gating_einsum",
                  "use_qk_norm"):
      check_bool(f"{name}.{field}", getattr(self, field))
    check_choice(f"{name}.dtype", self.dtype, DTYPES)

  @property
  def prompt_convention(self) -> str:
    """How a prompt becomes the decoder sequence: 'gemma', `<bos>` (id 2) then the prompt's
    tokens (`specjax.app.prompts`)."""
    return "gemma"

  @property
  def vocab_size(self) -> int:
    """The size of the logits' last axis (`num_embed`)."""
    return self.num_embed

  def query_pre_attn_scalar(self) -> float:
    """The factor queries are multiplied by before the scores."""
    if self.query_pre_attn_norm == "by_embed_dim_div_num_heads":
      return float(self.embed_dim // self.num_heads)
    if self.query_pre_attn_norm == "by_one_over_sqrt_embed_dim_div_num_heads":
      return float(self.embed_dim // self.num_heads) ** -0.5
    return float(self.head_dim) ** -0.5

  def rope(self, layer: int) -> Tuple[int, float]:
    """(base frequency, scale factor) of layer `layer`'s RoPE."""
    if self.attention_types[layer] == LOCAL:
      return self.local_base_frequency, float(self.local_scale_factor)
    return self.global_base_frequency, float(self.global_scale_factor)

  @classmethod
  def of(cls, config: Any, **overrides: Any) -> "GemmaConfig":
    """A GemmaConfig from a GemmaConfig, the gemma library's `TransformerConfig`, or a
    `gm.nn` model class or instance (its `config`); `overrides` (e.g. dtype) replace fields.
    The library's fields are read by name (its enums by their names); its vision encoder is
    left out (specjax decodes text)."""
    if isinstance(config, GemmaConfig):
      return dataclasses.replace(config, **overrides) if overrides else config
    source = getattr(config, "config", config)
    fields = [f.name for f in dataclasses.fields(cls) if f.name not in ("num_layers", "dtype")]
    missing = [f for f in fields if not hasattr(source, f)]
    if missing:
      raise ValueError(f"a Gemma config must be a GemmaConfig, a gemma TransformerConfig or a "
                       f"gm.nn model class; {type(config).__name__} has no field "
                       f"{missing[0]!r}")
    values: Dict[str, Any] = {f: getattr(source, f) for f in fields}
    values.update(overrides)
    return cls(**values)


_GEMMA3 = (LOCAL,) * 5 + (GLOBAL,)
_GEMMA2 = (LOCAL, GLOBAL)


def _gemma3(embed_dim, hidden_dim, num_heads, head_dim, num_kv_heads, num_layers, window,
            query_norm="by_one_over_sqrt_head_dim", global_scale=1.0) -> GemmaConfig:
  return GemmaConfig(num_embed=262_144, embed_dim=embed_dim, hidden_dim=hidden_dim,
                     num_heads=num_heads, head_dim=head_dim, num_kv_heads=num_kv_heads,
                     attention_types=_GEMMA3, num_layers=num_layers, use_qk_norm=True,
                     query_pre_attn_norm=query_norm, sliding_window_size=window,
                     transpose_gating_einsum=True, global_base_frequency=1_000_000,
                     global_scale_factor=global_scale)


def _gemma2(embed_dim, hidden_dim, num_heads, head_dim, num_kv_heads, num_layers,
            query_norm="by_one_over_sqrt_head_dim", transpose=True) -> GemmaConfig:
  return GemmaConfig(num_embed=256_128, embed_dim=embed_dim, hidden_dim=hidden_dim,
                     num_heads=num_heads, head_dim=head_dim, num_kv_heads=num_kv_heads,
                     attention_types=_GEMMA2, num_layers=num_layers, final_logit_softcap=30.0,
                     attn_logits_soft_cap=50.0, query_pre_attn_norm=query_norm,
                     sliding_window_size=4096, transpose_gating_einsum=transpose)


GEMMA_SIZES: Dict[str, GemmaConfig] = {
    "gemma3_270m": _gemma3(640, 2048, 4, 256, 1, 18, 512),
    "gemma3_1b": _gemma3(1152, 6 * 1152, 4, 256, 1, 26, 512),
    "gemma3_4b": _gemma3(2560, 2560 * 4, 8, 256, 4, 34, 1024, global_scale=8.0),
    "gemma3_12b": _gemma3(3840, 3840 * 4, 16, 256, 8, 48, 1024, global_scale=8.0),
    "gemma3_27b": _gemma3(5376, 5376 * 4, 32, 128, 16, 62, 1024,
                          "by_one_over_sqrt_embed_dim_div_num_heads", 8.0),
    "gemma2_2b": _gemma2(2304, 9216, 8, 256, 4, 26, transpose=False),
    "gemma2_9b": _gemma2(3584, 14336, 16, 256, 8, 42),
    "gemma2_27b": _gemma2(4608, 36864, 32, 128, 16, 46,
                          "by_one_over_sqrt_embed_dim_div_num_heads"),
}
"""The published text decoders (sizes of the gemma library's `gm.nn.Gemma3_270M` ...
`gm.nn.Gemma2_27B`), by the name of their gin file `models/<name>.gin`."""
