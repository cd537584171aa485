"""specjax.generate / Generator: strings in, texts out, as a user scripting sees them."""
import jax
import numpy as np
import pytest

import specjax
from specjax.app import bundled, prompts
from specjax.data.user_vocab import BUNDLED, resolve_vocabulary
from specjax.decode import DecodeConfig, autoregressive_decode
from specjax.sampling import Sampling

PROMPTS = ["This package provides", "A library for", "Rock Dodger is a"]


@pytest.fixture
def gin_restored(gin_cleared):
  yield


def test_generate_on_the_bundled_pair_returns_the_targets_own_greedy_texts(gin_restored):
  out = specjax.generate(PROMPTS, pair="bundled:lm", max_new_tokens=8, batch_size=2,
                         weights_dtype="float32")
  # The same texts from the target alone, decoded here without the app: greedy speculative
  # decoding emits exactly the target's greedy tokens.
  pair, vocab = bundled.load_pair("lm"), resolve_vocabulary(BUNDLED)
  rows = [prompts.text_ids(vocab, p, pair.target) for p in PROMPTS]
  inputs, lengths = prompts.frame(pair.target, rows, max_len=128, eos_id=vocab.eos_id)
  ar = autoregressive_decode(pair.target, pair.target_params, inputs, max_new_tokens=8,
                             rng=jax.random.PRNGKey(0), prompt_lengths=lengths,
                             config=DecodeConfig(sampling=Sampling(temperature=0.0),
                                                 eos_id=vocab.eos_id))
  expected = [np.asarray(ar.tokens[i, :int(ar.lengths[i])]).tolist() for i in range(3)]
  assert out.tokens == expected
  assert list(out) == out.texts == [vocab.decode(t) for t in expected]
  assert all(isinstance(t, str) and t for t in out.texts)
  for row, ids in zip(out.rows, expected):  # the per-row figures a user reads
    assert row.tokens == len(ids)
    assert -(-row.tokens // 5) <= row.target_calls <= row.tokens  # γ = 4: ≤ 5 tokens a call
    assert 0.0 <= row.alpha <= 1.0
    assert row.tokens_per_call == pytest.approx(row.tokens / row.target_calls)
  # the bundled pair speculates: some call bought more than one token
  assert out.tokens_per_call > 1.0


def test_a_generator_keeps_its_pair_and_takes_any_drafter_and_sampling(gin_restored):
  gen = specjax.Generator("runs/random_tiny.gin", drafter="prompt_lookup",
                          sampling=Sampling(temperature=1.0), max_new_tokens=6)
  assert gen.settings.drafter == "prompt_lookup"
  assert gen.settings.decoding.sampling.temperature == 1.0
  first = gen(["Hello world.", "The house is wonderful."], seed=3)
  again = gen(["Hello world.", "The house is wonderful."], seed=3)
  other = gen(["Hello world.", "The house is wonderful."], seed=4)
  assert first.tokens == again.tokens  # one key per row: the same seed, the same draws
  assert first.tokens != other.tokens  # 2 rows x 6 draws from a random model's spread law
  shorter = gen(["Hello world."], max_new_tokens=3, seed=3)
  assert shorter.tokens[0] == first.tokens[0][:3]  # a row's draws do not depend on its budget
  assert [r.tokens for r in first.rows] == [len(t) for t in first.tokens]


@pytest.mark.parametrize("call, message", [
    (lambda: specjax.generate(["x"], pair="bundled:nope"), r"unknown bundled pair 'bundled:nope'"),
    (lambda: specjax.generate(["x"], pair="runs/random_tiny.gin", gammma=3),
     r"^no setting 'gammma' \(did you mean 'gamma'\?\): the settings are decode_job's"),
    (lambda: specjax.generate(["x"], pair="runs/random_tiny.gin", output_dir="out"),
     r"'output_dir' is the main job's"),
    (lambda: specjax.Generator("runs/random_tiny.gin", max_new_tokens=2)("one string"),
     r"texts must be a list of strings"),
])
def test_bad_calls_are_one_clear_error(gin_restored, call, message):
  with pytest.raises(ValueError, match=message):
    call()
