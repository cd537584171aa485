"""Validation shared by the decode loops: each bad input is refused with a
message naming it, and oversized caches are refused before anything is allocated."""
import jax
import numpy as np
import pytest

from specjax.decode import autoregressive_decode, beam_search, speculative_decode
from specjax.decode import beam as beam_module
from specjax.decode import chain_checks as chain_checks_module
from specjax.decode import inputs as inputs_module
from specjax.decode import runner as runner_module
from specjax.draft import ModelDrafter, UnigramDrafter
from specjax.models import T5Config, T5Model
from specjax.testing import TableModel, random_table

V = 4
KEY = jax.random.PRNGKey(0)
PROMPT = np.array([[2, 3]], np.int32)


@pytest.fixture(scope="module")
def table():
  return random_table(1, V)


def _ar(table, **kw):
  args = dict(inputs=PROMPT, max_new_tokens=2, rng=KEY)
  args.update(kw)
  return autoregressive_decode(TableModel(V), table, args.pop("inputs"), **args)


def _spec(table, **kw):
  args = dict(inputs=PROMPT, max_new_tokens=2, gamma=2, rng=KEY)
  args.update(kw)
  return speculative_decode(TableModel(V), table, ModelDrafter(TableModel(V), max_gamma=3), table,
                            args.pop("inputs"), **args)


def _beam(table, **kw):
  args = dict(inputs=PROMPT, max_new_tokens=2, beam_size=2)
  args.update(kw)
  return beam_search(TableModel(V), table, args.pop("inputs"), **args)


LOOPS = {"autoregressive": _ar, "speculative": _spec, "beam": _beam}


@pytest.mark.parametrize("loop", LOOPS)
def test_float_token_ids_are_refused_not_truncated(table, loop):
  with pytest.raises(ValueError, match="integer token ids, got dtype float"):
    LOOPS[loop](table, inputs=np.array([[2.0, 37.9 / 10]]))


@pytest.mark.parametrize("loop", LOOPS)
def test_empty_batch_is_refused(table, loop):
  with pytest.raises(ValueError, match=r"batch >= 1.*shape \(0, 2\)"):
    LOOPS[loop](table, inputs=np.zeros((0, 2), np.int32))


@pytest.mark.parametrize("loop", LOOPS)
def test_bool_max_new_tokens_is_refused(table, loop):
  with pytest.raises(ValueError, match="max_new_tokens must be an integer >= 1, got True"):
    LOOPS[loop](table, max_new_tokens=True)


@pytest.mark.parametrize("loop", ["autoregressive", "speculative"])
@pytest.mark.parametrize("rng", [0, 7.5, np.int64(3)])
def test_a_number_as_rng_asks_for_a_prng_key(table, loop, rng):
  with pytest.raises(ValueError, match=r"rng must be a PRNG key.*jax\.random\.PRNGKey\(seed\)"):
    LOOPS[loop](table, rng=rng)


def test_typed_and_per_row_keys_still_work(table):
  assert _ar(table, rng=jax.random.key(0)).tokens.shape == (1, 2)
  assert _ar(table, rng=jax.random.split(KEY, 1)).tokens.shape == (1, 2)


@pytest.mark.parametrize("gamma", [2.5, True, 0, 4])
def test_gamma_must_be_an_integer_within_max_gamma(table, gamma):
  with pytest.raises(ValueError, match=r"gamma must be an integer in \[1, max_gamma=3\]"):
    _spec(table, gamma=gamma)


# ------------------------------------------------------------------- cache size


def _tiny_t5():
  return T5Model(T5Config(vocab_size=32, emb_dim=8, num_heads=2, num_encoder_layers=1,
                          num_decoder_layers=2, head_dim=4, mlp_dim=16))


def test_cache_bytes_is_layers_x_2_x_heads_x_head_dim_x_dtype_per_slot():
  model = _tiny_t5()
  per_slot = 2 * 2 * 2 * 4 * 4  # layers × (k, v) × heads × head_dim × float32
  assert inputs_module.cache_bytes(model, 3, 128) == 3 * 128 * per_slot
  assert inputs_module.cache_bytes(TableModel(V), 3, 128) == 3 * 128 * 4  # int32 per slot


def _forbid_compiled_call(monkeypatch):
  def fail(*args, **kwargs):
    raise AssertionError("the compiled loop was reached: the cache would have been allocated")
  for module, name in ((runner_module, "run_loop"), (beam_module, "_beam_search")):
    monkeypatch.setattr(module, name, fail)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_huge_budget_is_refused_before_allocating(table, loop, monkeypatch):
  _forbid_compiled_call(monkeypatch)
  # 10**9 slots of an int32 table cache: 4 GB (8 GB for beams of 2) > half of a 4 GiB device.
  monkeypatch.setattr(inputs_module, "device_memory", lambda partitioner=None: 4 * 2**30)
  with pytest.raises(ValueError, match=r"KV caches would take [\d.]+ GiB .* above the limit "
                                       r"of 2\.00 GiB"):
    LOOPS[loop](table, max_new_tokens=10**9)


def test_the_limit_counts_the_draft_model_too(table, monkeypatch):
  _forbid_compiled_call(monkeypatch)
  # 128 slots × 4 bytes: target alone 512 B, target + model draft 1024 B; limit 768 B. The
  # round's working set has a check of its own (tests/test_hostile.py, γ = 10000): counted as
  # nothing here, so the caches alone decide.
  monkeypatch.setattr(chain_checks_module, "chain_round_bytes", lambda *args: 0)
  monkeypatch.setattr(inputs_module, "device_memory", lambda partitioner=None: 1536)
  with pytest.raises(ValueError, match=r"2 model\(s\)"):
    _spec(table)
  with pytest.raises(AssertionError, match="compiled loop was reached"):  # the target alone fits
    unigram, unigram_params = UnigramDrafter([np.arange(V)], V, max_gamma=3)
    speculative_decode(TableModel(V), table, unigram, unigram_params, PROMPT,
                       max_new_tokens=2, gamma=2, rng=KEY)


def test_device_memory_on_cpu_is_the_hosts():
  import os
  assert inputs_module.device_memory() == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
