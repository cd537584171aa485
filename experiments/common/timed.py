"""Timings of the experiments' calls: model, drafter and verifier calls in one jitted loop each
(per-call milliseconds, cost ratios c and r(γ)); whole decodes side by side are
`experiments.common.compare`'s."""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from experiments.common.pairs import Pair
from specjax import timing

def passes_for(seconds_per_pass: float, min_seconds: float, *, low: int = 1,
               high: Optional[int] = None) -> int:
  """Timed passes that hold at least `min_seconds` when one takes `seconds_per_pass`,
  clipped to [low, high]."""
  passes = max(int(np.ceil(min_seconds / max(seconds_per_pass, 1e-9))), low)
  return passes if high is None else min(passes, high)


Run = Tuple[Callable[[], Any], int]
"""(a zero-argument call, the model calls / steps it makes): `decode_loop`, `propose_loop`,
`verify_loop`."""


def ms_per_call(runs: Dict[str, Run], repeats: int) -> Tuple[Dict[str, float], timing.Timings]:
  """Median ms per model call of each run (`specjax.timing.interleaved`, warm-up apart), and the
  timings themselves (the runs' outputs among them)."""
  t = timing.interleaved({name: fn for name, (fn, _) in runs.items()}, repeats)
  return {name: 1e3 * t.median(name) / calls for name, (_, calls) in runs.items()}, t


def decode_loop(model, params, batch: int, cache_len: int, k: int, *, encoded: Any = None,
                position: int = 20, calls: int = 40) -> Run:
  """`calls` k-token `model.decode` calls at `batch` rows, in one jitted `fori_loop` with the
  cache carried: the calls as the decode loops make them (loop-invariant work hoisted out of
  the loop, dispatch not counted). Rows sit at slots `position` + 0..7, apart; results are
  folded into the carry so that XLA cannot drop them. Compiles on its first call."""
  cache = model.init_cache(batch, cache_len)

  @jax.jit
  def loop(params, cache, encoded):
    def body(i, carry):
      cache, acc = carry
      positions = position + (i + jnp.arange(batch, dtype=jnp.int32)) % 8
      logits, cache = model.decode(params, cache, jnp.full((batch, k), 5, jnp.int32),
                                   positions, encoded)
      return cache, acc + jnp.argmax(logits[:, -1], -1).sum().astype(jnp.float32)
    return jax.lax.fori_loop(0, calls, body, (cache, 0.0))[1]

  return (lambda: loop(params, cache, encoded)), calls


def paired_loop(target, tparams, draft, dparams, batch: int, cache_len: int, k: int,
                draft_steps: int, *, target_encoded: Any = None, draft_encoded: Any = None,
                position: int = 20, calls: int = 40) -> Run:
  """A round's two models in one jitted `fori_loop`: per iteration one k-token target call then
  `draft_steps` one-token draft calls, as `decode_loop` makes them (each call's input depends on
  the last result, so they run in turn). Set beside `decode_loop`'s target and draft loops, it
  shows what the models cost each other when they share the machine's caches within a round.
  Compiles on its first call."""
  tcache, dcache = target.init_cache(batch, cache_len), draft.init_cache(batch, cache_len)

  @jax.jit
  def loop(tparams, dparams, tcache, dcache, target_encoded, draft_encoded):
    def body(i, carry):
      tcache, dcache, acc = carry
      positions = position + (i + jnp.arange(batch, dtype=jnp.int32)) % 8
      token = 5 + acc.astype(jnp.int32) % 2  # data-dependent: the calls cannot overlap
      logits, tcache = target.decode(tparams, tcache, jnp.full((batch, k), token, jnp.int32),
                                     positions, target_encoded)
      acc = acc + jnp.argmax(logits[:, -1], -1).sum().astype(jnp.float32)
      for step in range(draft_steps):
        token = 5 + acc.astype(jnp.int32) % 2
        logits, dcache = draft.decode(dparams, dcache, jnp.full((batch, 1), token, jnp.int32),
                                      positions + step, draft_encoded)
        acc = acc + jnp.argmax(logits[:, -1], -1).sum().astype(jnp.float32)
      return tcache, dcache, acc
    return jax.lax.fori_loop(0, calls, body, (tcache, dcache, 0.0))[2]

  return (lambda: loop(tparams, dparams, tcache, dcache, target_encoded, draft_encoded)), calls


def c_in_round(together_s: float, target_call_s: float, gamma: int, target_step_s: float
               ) -> float:
  """A draft step's cost in a round, in target steps: `paired_loop`'s iteration (a (γ+1)-token
  target call and γ draft steps) less the target's call timed alone, per draft step, over the
  target's one-token step (any consistent time unit)."""
  return (together_s - target_call_s) / gamma / target_step_s


def propose_loop(drafter, params, prompts: np.ndarray, cache_len: int, gamma: int,
                 n: int = 30) -> Run:
  """n drafter proposals of `gamma` guesses per row (catch-up window included), greedy, in one
  jitted loop. prompts: int32 [B, W]. Compiles on its first call."""
  from specjax.draft import Accepted  # pylint: disable=import-outside-toplevel
  from specjax.sampling import Sampling  # pylint: disable=import-outside-toplevel
  batch = prompts.shape[0]
  seq = np.zeros((batch, cache_len), np.int32)
  seq[:, :prompts.shape[1]] = prompts
  length = jnp.full((batch,), prompts.shape[1], jnp.int32)
  gammas = jnp.full((batch,), gamma, jnp.int32)

  @jax.jit
  def loop(params, seq, length):
    state = drafter.init(params, jnp.asarray(prompts), seq, length, cache_len)
    keys = jax.random.split(jax.random.PRNGKey(0), batch)

    def body(i, carry):
      state, acc = carry
      proposal, state = drafter.propose(params, state, seq, length + i, gammas, keys,
                                       Sampling(temperature=0.0))
      state = drafter.update(state, Accepted(start=length + i, n=jnp.full((batch,), 2, jnp.int32),
                                             gamma=gammas))
      return state, acc + proposal.probs[:, 0, 0].sum() + proposal.tokens[:, 0].sum()
    return jax.lax.fori_loop(0, n, body, (state, 0.0))[1]
  return (lambda: loop(params, seq, length)), n


def verify_loop(config, batch: int, gamma: int, vocab: int, n: int = 50) -> Run:
  """n verification steps (Algorithm 1 on γ+1 target and γ draft distributions per row) of
  `config`'s verifier, in one jitted loop. Compiles on its first call."""
  from specjax.verify import verify_batch  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(0)
  logits = jnp.asarray(rng.normal(size=(batch, gamma + 1, vocab)).astype(np.float32))
  q = jax.nn.softmax(jnp.asarray(rng.normal(size=(batch, gamma, vocab)).astype(np.float32)), -1)
  guesses = jnp.zeros((batch, gamma), jnp.int32)
  keys = jax.random.split(jax.random.PRNGKey(0), batch)

  @jax.jit
  def loop(logits, q):
    def body(i, acc):
      n_acc, _, overlap = verify_batch(config.sampling, config.verifier, config.lenience, keys,
                                       jnp.full((batch,), 10 + i, jnp.int32), guesses, q,
                                       logits + acc, jnp.full((batch,), gamma, jnp.int32))
      return acc + 1e-6 * n_acc.sum().astype(jnp.float32) + overlap[0, 0]
    return jax.lax.fori_loop(0, n, body, 0.0)
  return (lambda: loop(logits, q)), n


def cost_ratios(pair: Pair, inputs: np.ndarray, gammas: Sequence[int], cache_len: int,
                repeats: int, calls: int = 40) -> Dict:
  """c = draft step / target step (k = 1) and r(γ) = target (γ+1)-token call / 1-token call,
  from in-loop `decode` calls at batch 1 (`decode_loop`), and per γ c in a round: (a
  (γ+1)-token target call and γ draft steps in one loop (`paired_loop`) − the target's call
  alone) / γ / the target's step, what a draft step costs where the two models share the
  caches. All interleaved, medians of `repeats`.

  inputs: int32 [1, W] (encoded once per model for an encoder-decoder); the k tokens sit in a
  generation's middle: at W // 2 (+ 0..7) for an LM, at 8 for an encoder-decoder's decoder.
  Returns {'c', 'target_step_s', 'draft_step_s', 'r': {γ: r(γ)}, 'c_round': {γ: c}}.
  """
  position = 8 if pair.target.is_encoder_decoder else inputs.shape[1] // 2
  encode = lambda model, params: (model.encode(params, jnp.asarray(inputs))
                                  if model.is_encoder_decoder else None)
  t_enc, d_enc = encode(pair.target, pair.target_params), encode(pair.draft, pair.draft_params)

  def loop(model, params, k, encoded):
    return decode_loop(model, params, 1, cache_len, k, encoded=encoded, position=position,
                       calls=calls)

  ks = sorted({1, *[g + 1 for g in gammas]})
  runs = {f"target k={k}": loop(pair.target, pair.target_params, k, t_enc) for k in ks}
  runs["draft k=1"] = loop(pair.draft, pair.draft_params, 1, d_enc)
  for g in gammas:
    runs[f"round γ={g}"] = paired_loop(pair.target, pair.target_params, pair.draft,
                                       pair.draft_params, 1, cache_len, g + 1, g,
                                       target_encoded=t_enc, draft_encoded=d_enc,
                                       position=position, calls=calls)
  ms, _ = ms_per_call(runs, repeats)
  target = {k: ms[f"target k={k}"] / 1e3 for k in ks}
  draft = ms["draft k=1"] / 1e3
  return {"c": draft / target[1], "target_step_s": target[1], "draft_step_s": draft,
          "r": {g: target[g + 1] / target[1] for g in gammas},
          "c_round": {g: c_in_round(ms[f"round γ={g}"] / 1e3, target[g + 1], g, target[1])
                      for g in gammas}}
