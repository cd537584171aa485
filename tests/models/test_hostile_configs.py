"""Hostile inputs for model configs (docs/results/hostile_probe.md): a model.gin value of
the wrong type is named with the file, never taken for truthy."""
import pytest

from specjax.models import DecoderOnlyConfig, T5Config, read_model_gin

BASE = dict(vocab_size=10, emb_dim=8, num_heads=2, head_dim=4, mlp_dim=8)


@pytest.mark.parametrize("value", ["yes", "False", 1, None])
def test_logits_via_embedding_must_be_a_bool(value):
  # 'False' was truthy: the model silently tied its logits to the embedding.
  with pytest.raises(ValueError, match=f"DecoderOnlyConfig.logits_via_embedding must be True "
                                       f"or False, got {value!r}"):
    DecoderOnlyConfig(**BASE, num_layers=1, logits_via_embedding=value)
  with pytest.raises(ValueError, match="T5Config.logits_via_embedding must be True or False"):
    T5Config(**BASE, num_encoder_layers=1, num_decoder_layers=1, logits_via_embedding=value)


@pytest.mark.parametrize("line, message", [
    ("DecoderOnlyConfig.logits_via_embedding = 'False'", "logits_via_embedding must be True or"),
    ("DecoderOnlyConfig.num_heads = 'x'", "num_heads must be a positive integer, got 'x'"),
    ("DecoderOnlyConfig.vocab_size = 0", "vocab_size must be a positive integer, got 0"),
    ("DecoderOnlyConfig.num_expertz = 4", "has no field 'num_expertz'"),
])
def test_model_gin_values_of_the_wrong_type_name_the_file(tmp_path, line, message):
  text = "\n".join(f"DecoderOnlyConfig.{k} = {v!r}" for k, v in dict(BASE, num_layers=1).items())
  (tmp_path / "model.gin").write_text(text + "\n" + line + "\n")
  with pytest.raises(ValueError, match=f"model.gin.*{message}"):
    read_model_gin(str(tmp_path))
