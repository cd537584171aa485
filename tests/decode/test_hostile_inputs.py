"""Hostile decode inputs, beyond the cases of docs/results/hostile_probe.md: settings of
the wrong type or range, ids outside the vocabulary, sizes past int32 and logits no
distribution can be read from are refused with a message naming them, never decoded into
silent token-0 output. Nothing here compiles a new loop except the two value tests at the
end, which reuse test_inputs' shapes (tiny table models)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.decode import (DecodeConfig, autoregressive_decode, beam_search,
                            speculative_beam_search, speculative_decode)
from specjax.decode import inputs as inputs_module
from specjax.draft import HierarchicalDrafter, ModelDrafter, NGramDrafter, PromptLookupDrafter
from specjax.sampling import Sampling
from specjax.testing import TableModel, random_table

V = 4
KEY = jax.random.PRNGKey(0)
PROMPT = np.array([[2, 3]], np.int32)
MODEL = TableModel(V)


@pytest.fixture(scope="module")
def table():
  return random_table(1, V)


def _ar(params, **kw):
  args = dict(max_new_tokens=2, rng=KEY)
  args.update(kw)
  return autoregressive_decode(MODEL, params, args.pop("inputs", PROMPT), **args)


def _spec(params, **kw):
  args = dict(max_new_tokens=2, gamma=2, rng=KEY)
  args.update(kw)
  return speculative_decode(MODEL, params, ModelDrafter(MODEL, max_gamma=3), params,
                            args.pop("inputs", PROMPT), **args)


# ------------------------------------------------------------------ settings


@pytest.mark.parametrize("kwargs, message", [
    (dict(eos_id=2.5), "eos_id must be a token id .* got 2.5"),
    (dict(eos_id="1"), "eos_id must be a token id .* got '1'"),
    (dict(eos_id=True), "eos_id must be a token id .* got True"),
    (dict(eos_id=-2), "eos_id must be a token id .* or -1 for none, got -2"),
    (dict(cache_len=0), "cache_len must be None or an integer >= 1, got 0"),
    (dict(cache_len=-5), "cache_len must be None or an integer >= 1, got -5"),
    (dict(cache_len=100.5), "cache_len must be None or an integer >= 1, got 100.5"),
    (dict(cache_len=True), "cache_len must be None or an integer >= 1, got True"),
    (dict(trace="no"), "trace must be True or False, got 'no'"),
    (dict(cost_coefficient=float("nan")), "cost_coefficient must be a finite number >= 0"),
    (dict(cost_coefficient=float("inf")), "cost_coefficient must be a finite number >= 0"),
    (dict(lenience="0.5"), r"lenience must be a number in \(0, 1\], got '0.5'"),
    (dict(lenience=True), r"lenience must be a number in \(0, 1\], got True"),
    (dict(verifier="fused"), "verifier must be a specjax.verify verifier .* got 'fused'"),
    (dict(verifier=None), "verifier must be a specjax.verify verifier .* got None"),
    (dict(sampling=None), "sampling must be a specjax Sampling, got None"),
])
def test_decode_config_refuses_wrong_types_and_ranges(kwargs, message):
  with pytest.raises(ValueError, match=message):
    DecodeConfig(**kwargs)


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=float("inf")), "temperature must be a finite number >= 0, got inf"),
    (dict(temperature=None), "temperature must be a finite number >= 0, got None"),
    (dict(temperature="1"), "temperature must be a finite number >= 0, got '1'"),
    (dict(temperature=True), "temperature must be a finite number >= 0, got True"),
    (dict(temperature=1e-45), "below float32's smallest normal number .* use 0 for greedy"),
    (dict(top_k=True), "top_k must be an integer >= 0, got True"),
    (dict(top_k=None), "top_k must be an integer >= 0, got None"),
    (dict(top_p="0.9"), r"top_p must be in \(0, 1\], got '0.9'"),
])
def test_sampling_refuses_wrong_types_and_ranges(kwargs, message):
  with pytest.raises(ValueError, match=message):
    Sampling(**kwargs)


def test_a_config_that_is_not_a_decode_config_is_named(table):
  with pytest.raises(ValueError, match="config must be a DecodeConfig, got dict"):
    _ar(table, config={"eos_id": 1})


@pytest.mark.parametrize("eos_id", [V, 10**6])
@pytest.mark.parametrize("loop", ["autoregressive", "speculative", "beam", "speculative_beam"])
def test_eos_outside_the_vocabulary_is_refused(table, loop, eos_id):
  # An EOS the model can never emit would silently run every row to its budget.
  message = rf"eos_id must be a token id in \[0, vocab_size=4\) or -1 \(no EOS\), got {eos_id}"
  with pytest.raises(ValueError, match=message):
    if loop == "autoregressive":
      _ar(table, config=DecodeConfig(eos_id=eos_id))
    elif loop == "speculative":
      _spec(table, config=DecodeConfig(eos_id=eos_id))
    elif loop == "beam":
      beam_search(MODEL, table, PROMPT, beam_size=2, max_new_tokens=2, eos_id=eos_id)
    else:
      speculative_beam_search(MODEL, table, MODEL, table, PROMPT, beam_size=2, draft_beam_size=2,
                              gamma=2, max_new_tokens=2, eos_id=eos_id)


# ------------------------------------------------------------------ inputs and sizes


def test_ragged_inputs_name_the_argument(table):
  with pytest.raises(ValueError, match=r"inputs must be a rectangular int array .*pad the rows"):
    _ar(table, inputs=[[1, 2], [3]])


def test_padding_inside_a_prompt_is_refused_unless_lengths_say_so():
  # The default length counts non-zero ids: [2, 0, 3] would silently decode from [2, 0].
  with pytest.raises(ValueError, match=r"row 1 has a 0 \(padding\) before token 3 at column 2"):
    inputs_module.prefix_lengths(MODEL, np.array([[2, 3, 1], [2, 0, 3]]), None)
  np.testing.assert_array_equal(
      inputs_module.prefix_lengths(MODEL, np.array([[2, 3, 1], [2, 0, 3]]), [3, 3]), [3, 3])
  np.testing.assert_array_equal(  # trailing padding is what the default expects
      inputs_module.prefix_lengths(MODEL, np.array([[2, 3, 0], [2, 0, 0]]), None), [2, 1])


@pytest.mark.parametrize("budget", [2**31 - 100, 2**40])
def test_budgets_past_int32_positions_are_refused(table, budget):
  # The table model's int32 cache of 2**31 slots is 8 GiB: the memory check alone let it
  # through to an OverflowError deep in jax.
  with pytest.raises(ValueError, match=r"beyond the int32 positions of the loops"):
    _ar(table, max_new_tokens=budget)


@pytest.mark.parametrize("rng, shape", [(np.array([0.5, 1.5]), r"float\d+ \(2,\)"),
                                        (np.array([1, 2, 3], np.uint32), r"uint32 \(3,\)"),
                                        (np.zeros((1, 3), np.uint32), r"uint32 \(1, 3\)")])
def test_raw_keys_of_the_wrong_dtype_or_shape_are_refused(table, rng, shape):
  with pytest.raises(ValueError, match=rf"rng must be a PRNG key .*got {shape}: pass "
                                       r"jax\.random\.PRNGKey\(seed\)"):
    _ar(table, rng=rng)


@pytest.mark.parametrize("build, message", [
    (lambda: ModelDrafter(MODEL, max_gamma=0), "ModelDrafter.max_gamma must be an integer >= 1"),
    (lambda: ModelDrafter(MODEL, max_gamma=2.5), "ModelDrafter.max_gamma .* got 2.5"),
    (lambda: ModelDrafter(MODEL, max_gamma=True), "ModelDrafter.max_gamma .* got True"),
    (lambda: ModelDrafter(MODEL, max_gamma=3, window=1), "ModelDrafter.window .* >= 2"),
    (lambda: PromptLookupDrafter(vocab=V, max_gamma=0), "PromptLookupDrafter.max_gamma"),
    (lambda: PromptLookupDrafter(vocab=0, max_gamma=2), "PromptLookupDrafter.vocab"),
    (lambda: PromptLookupDrafter(vocab=V, max_gamma=2, max_ngram=0),
     "PromptLookupDrafter.max_ngram"),
    (lambda: NGramDrafter(order=3, vocab=V, max_gamma=2), "order must be 1 .* or 2"),
    (lambda: NGramDrafter(order=1, vocab=V, max_gamma=-1), "NGramDrafter.max_gamma"),
    (lambda: HierarchicalDrafter(MODEL, ModelDrafter(MODEL, max_gamma=3, window=3),
                                 max_gamma=1.5), "HierarchicalDrafter.max_gamma .* got 1.5"),
])
def test_drafter_sizes_are_checked_when_built(build, message):
  with pytest.raises(ValueError, match=message):
    build()


# ------------------------------------------------------------------ values (compiled)


@pytest.mark.parametrize("fill", [np.inf, -np.inf])
@pytest.mark.parametrize("loop", ["autoregressive", "speculative"])
def test_logits_without_a_distribution_are_an_error_not_token_0(table, loop, fill):
  # +inf anywhere, or -inf everywhere, holds no NaN, yet softmax turns it into NaN and the
  # loops emitted token 0 in silence.
  broken = jnp.full_like(table, fill)
  with pytest.raises(ValueError, match=r"NaN logits \(or \+inf, or -inf everywhere\) .* "
                                       r"rows \[0\]"):
    (_ar if loop == "autoregressive" else _spec)(broken, inputs=PROMPT)


def test_a_tiny_temperature_is_greedy_not_nan(table):
  # Logits of size ~500 over T = 1e-37 overflow float32: every token was -inf, the softmax
  # NaN and the output silently token 0. Subtracting the row's maximum first keeps the argmax.
  sharp = table * 100
  config = lambda t: DecodeConfig(sampling=Sampling(temperature=t), eos_id=-1, cache_len=16)
  tiny = _ar(sharp, max_new_tokens=6, config=config(1e-37)).tokens
  greedy = _ar(sharp, max_new_tokens=6, config=config(0.0)).tokens
  np.testing.assert_array_equal(tiny, greedy)
  assert np.asarray(tiny).any()  # not the all-zero output of the NaN path
