"""T5X's decoder-only conventions: [BOS, inputs] prompts, causal or prefix-LM attention.

T5X's DecoderOnlyModel decodes from shift_right(inputs ++ targets): the prompt it prefills is
[BOS 0, inputs...] (inputs end with EOS), bidirectional over those positions when
`inputs_bidirectional_attention`. Here prompts framed by `specjax.app.prompts` are decoded
greedily (autoregressive and speculative) and compared with a greedy loop written against
teacher-forced `logits()` with the same mask, token for token.
"""
import functools

import jax
import numpy as np
import pytest

from specjax.app import prompts
from specjax.decode import DecodeConfig, autoregressive_decode, speculative_decode
from specjax.draft import ModelDrafter
from specjax.models import DecoderOnlyConfig, build_model
from specjax.sampling import Sampling

V, EOS, NEW, MAX_LEN = 64, 1, 8, 10
GREEDY = DecodeConfig(sampling=Sampling(temperature=0.0), eos_id=EOS, cache_len=32)
ROWS = [[5, 9, 13, EOS], [7, EOS], [3, 4, 5, 6, 7, 8, 9, EOS]]  # task ids: inputs + EOS


def _model(bidirectional, layers, emb, convention="t5x"):
  return build_model(DecoderOnlyConfig(
      vocab_size=V, emb_dim=emb, num_heads=2, num_layers=layers, head_dim=8, mlp_dim=2 * emb,
      logits_via_embedding=False,  # a random tied embedding mostly repeats the last token
      prompt_convention=convention, inputs_bidirectional_attention=bidirectional))


def _greedy_by_teacher_forcing(model, params, prompt):
  """T5X's greedy decode of one prompt [BOS, inputs]: each next token is the argmax of the
  teacher-forced logits at the last position; the prompt is the prefix (bidirectional when
  the model is a prefix LM). A fixed width keeps one compiled shape: positions after the
  last real token are padding no earlier query can see (causal)."""
  width = MAX_LEN + 1 + NEW
  seq, out = list(prompt), []
  for _ in range(NEW):
    tokens = np.zeros((1, width), np.int32)
    tokens[0, :len(seq)] = seq
    logits = np.asarray(model.logits(params, tokens, np.array([len(prompt)], np.int32)))
    token = int(np.argmax(logits[0, len(seq) - 1]))
    out.append(token)
    seq.append(token)
    if token == EOS:
      break
  return out


@pytest.fixture(scope="module", params=[False, True], ids=["causal", "prefix_lm"])
def pair(request):
  target, draft = _model(request.param, 2, 32), _model(request.param, 1, 16)
  return target, _params(2, 32, 0), draft, _params(1, 16, 1)


@functools.lru_cache(maxsize=None)
def _params(layers, emb, seed):
  """The same weights for the causal and the prefix-LM variant (the mask is not a weight)."""
  return _model(False, layers, emb).init(jax.random.PRNGKey(seed))


def test_t5x_prompts_are_bos_then_inputs():
  model = _model(False, 1, 16)
  inputs, lengths = prompts.frame(model, ROWS, max_len=MAX_LEN, eos_id=EOS)
  assert lengths.tolist() == [len(r) + 1 for r in ROWS]
  for row, framed, n in zip(ROWS, inputs, lengths):
    assert framed[:n].tolist() == [0] + row and not framed[n:].any()
  # A text prompt is the `inputs` feature: its tokens + EOS (then BOS in front).
  class Chars:  # a vocabulary stand-in: one id per character
    eos_id = EOS
    def encode(self, text):
      return [ord(c) - 90 for c in text]
  assert prompts.text_ids(Chars(), "abc", model) == [7, 8, 9, EOS]
  lm = _model(False, 1, 16, convention="lm")
  assert prompts.text_ids(Chars(), "abc", lm) == [7, 8, 9]
  lm_inputs, lm_lengths = prompts.frame(lm, [[7, 8, 9]], max_len=MAX_LEN, eos_id=EOS)
  assert lm_inputs[0, :3].tolist() == [7, 8, 9] and lm_lengths.tolist() == [3]


def test_t5x_inputs_are_cut_keeping_eos():
  model = _model(False, 1, 16)
  inputs, lengths = prompts.frame(model, [ROWS[2]], max_len=4, eos_id=EOS)
  assert inputs[0, :lengths[0]].tolist() == [0, 3, 4, 5, EOS]


def test_bidirectional_prefix_changes_the_logits(pair):
  """The prefix-LM mask is really used: the last prompt position's logits (which see the
  whole prompt either way) differ, through the earlier positions' bidirectional states."""
  target, params, _, _ = pair
  tokens = np.array([[0] + ROWS[0]], np.int32)
  prefix = np.array([tokens.shape[1]], np.int32)
  mine = np.asarray(target.logits(params, tokens, prefix))[0, -1]
  other = _model(not target.prefix_lm, 2, 32)
  theirs = np.asarray(other.logits(params, tokens, prefix))[0, -1]
  assert not np.allclose(mine, theirs, atol=1e-4)


def test_greedy_decoding_matches_t5x_prefix_lm_semantics(pair):
  target, target_params, draft, draft_params = pair
  inputs, lengths = prompts.frame(target, ROWS, max_len=MAX_LEN, eos_id=EOS)
  want = [_greedy_by_teacher_forcing(target, target_params, inputs[b, :lengths[b]].tolist())
          for b in range(len(ROWS))]
  rng = jax.random.PRNGKey(0)
  ar = autoregressive_decode(target, target_params, inputs, max_new_tokens=NEW, rng=rng,
                             config=GREEDY, prompt_lengths=lengths)
  spec = speculative_decode(target, target_params, ModelDrafter(draft, max_gamma=3),
                            draft_params, inputs, max_new_tokens=NEW, gamma=3, rng=rng,
                            config=GREEDY, prompt_lengths=lengths)
  for b in range(len(ROWS)):
    assert np.asarray(ar.tokens[b, :ar.lengths[b]]).tolist() == want[b]
    assert np.asarray(spec.tokens[b, :spec.lengths[b]]).tolist() == want[b]
  # The drafts were not the target's: some guesses were rejected, so identity means something.
  assert int(np.asarray(spec.target_calls).sum()) > sum(map(len, want)) // 4


def test_without_bos_the_outputs_differ(pair):
  """The BOS is part of what the model sees: dropping it (the 'lm' convention on the same
  weights) changes the greedy tokens of at least one row, so the check above can fail."""
  target, target_params, _, _ = pair
  inputs, lengths = prompts.frame(target, ROWS, max_len=MAX_LEN, eos_id=EOS)
  with_bos = [_greedy_by_teacher_forcing(target, target_params, inputs[b, :lengths[b]].tolist())
              for b in range(len(ROWS))]
  without = [_greedy_by_teacher_forcing(target, target_params, row) for row in ROWS]
  assert with_bos != without


def test_target_and_draft_must_frame_alike(tiny_t5_pair):
  from specjax.app import check_models  # pylint: disable=import-outside-toplevel
  class Vocab:
    def __init__(self, size):
      self.vocab_size = size
  t5x = _model(False, 1, 16)
  lm = _model(False, 1, 16, convention="lm")
  check_models(Vocab(V - 4), {"target": t5x, "draft": t5x})  # logits may exceed the vocabulary
  with pytest.raises(ValueError, match="frame prompts differently"):
    check_models(Vocab(V), {"target": t5x, "draft": lm})
  with pytest.raises(ValueError, match="vocab_size 64 is smaller than the vocabulary's 65"):
    check_models(Vocab(V + 1), {"target": t5x})
  assert prompts.convention(tiny_t5_pair.target) == "encoder"


def test_prompt_convention_is_checked():
  with pytest.raises(ValueError, match="prompt_convention must be one of"):
    DecoderOnlyConfig(vocab_size=V, emb_dim=8, num_heads=1, num_layers=1, head_dim=4,
                      mlp_dim=8, prompt_convention="gpt")
