"""specjax T5 -> HuggingFace T5ForConditionalGeneration: logits and greedy outputs agree.

torch is imported by the tests that use it, not when the suite is collected (seconds in every
pytest process).
"""
import jax
import numpy as np
import pytest

from specjax.app import export_hf
from specjax.decode import DecodeConfig, autoregressive_decode
from specjax.models.t5 import T5Config, T5Model
from specjax.sampling import Sampling


@pytest.fixture(scope="module", params=[False, True], ids=["untied_t5_1_1", "tied"])
def pair(request):
  config = T5Config(vocab_size=96, emb_dim=16, num_heads=2, num_encoder_layers=2,
                    num_decoder_layers=2, head_dim=8, mlp_dim=24,
                    logits_via_embedding=request.param)
  model = T5Model(config)
  params = model.init(jax.random.PRNGKey(3))
  # random-init T5X query kernels carry the 1/sqrt(D) folding; scale the relative
  # bias up so a wrong bucket mapping or transpose cannot hide in small numbers
  params = jax.tree.map(lambda x: x, params)
  for stack in ("encoder", "decoder"):
    params[stack]["relpos_bias"]["rel_embedding"] = params[stack]["relpos_bias"][
        "rel_embedding"] * 5.0 + np.arange(32)[None, :] * 0.1
  return config, model, params


INPUTS = np.array([[5, 17, 33, 9, 1, 0, 0], [44, 2, 61, 70, 88, 12, 1]], np.int32)


def test_logits_match(pair):
  config, model, params = pair
  hf = export_hf.to_hf(config, params)
  dec = np.array([[0, 7, 8, 9, 10, 11], [0, 3, 4, 5, 6, 95]], np.int32)
  ours = np.asarray(model.logits(params, INPUTS, dec))
  import torch  # pylint: disable=import-outside-toplevel
  with torch.no_grad():
    theirs = hf(input_ids=torch.from_numpy(INPUTS.astype(np.int64)),
                attention_mask=torch.from_numpy((INPUTS != 0).astype(np.int64)),
                decoder_input_ids=torch.from_numpy(dec.astype(np.int64))).logits.numpy()
  np.testing.assert_allclose(theirs, ours, atol=1e-4, rtol=1e-4)
  assert np.abs(ours).max() > 1e-3  # not trivially zero


def test_greedy_outputs_match_and_save_roundtrip(pair, tmp_path):
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  config, model, params = pair
  export_hf.save_hf(config, params, str(tmp_path))
  hf = transformers.T5ForConditionalGeneration.from_pretrained(str(tmp_path)).eval()
  ours = autoregressive_decode(model, params, INPUTS, max_new_tokens=8, rng=jax.random.PRNGKey(0),
                               config=DecodeConfig(sampling=Sampling(temperature=0.0)))
  for i in range(len(INPUTS)):
    row = INPUTS[i][INPUTS[i] != 0][None].astype(np.int64)
    with torch.no_grad():
      out = hf.generate(input_ids=torch.from_numpy(row), do_sample=False, max_new_tokens=8)
    expect = np.asarray(ours.tokens[i, :int(ours.lengths[i])]).tolist()
    assert out[0, 1:].tolist()[:len(expect)] == expect


def test_state_dict_names_and_transposes(pair):
  config, _, params = pair
  state = export_hf.hf_state_dict(config, params)
  q = params["encoder"]["layers_1"]["attention"]["query"]["kernel"]
  np.testing.assert_array_equal(state["encoder.block.1.layer.0.SelfAttention.q.weight"],
                                np.asarray(q).T)
  assert state["decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"].shape == (32, 2)
  assert "encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight" not in state
  assert ("lm_head.weight" in state) == (not config.logits_via_embedding)


def test_bad_input_is_named():
  config = T5Config(vocab_size=16, emb_dim=8, num_heads=2, num_encoder_layers=1,
                    num_decoder_layers=1, head_dim=4, mlp_dim=8)
  params = T5Model(config).init(jax.random.PRNGKey(0))
  del params["decoder"]["decoder_norm"]
  with pytest.raises(ValueError, match="decoder_norm"):
    export_hf.hf_state_dict(config, params)
  with pytest.raises(ValueError, match="no HuggingFace"):
    export_hf.hf_config_dict(T5Config(vocab_size=16, emb_dim=8, num_heads=2, num_encoder_layers=1,
                                      num_decoder_layers=1, head_dim=4, mlp_dim=8,
                                      mlp_activations=("tanh",)))
