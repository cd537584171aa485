"""The 'auto' γ policy's rule, its cost table and its compiled phases.

Invariant: a decision is a pure function of the `CostTable` (seconds of the narrow round
s[0], a plain target step, and of a round in each compiled bucket, measured inside the
compiled loop by `time_rounds`) and the decode state (each row's running α̂, its prior from
the table's α via `prior_of`, and its room left): the batch plays

    g* = argmin_{g ≤ gamma_cap} s[g] · max_{b active} room_b / E_b(g)      (ties: the smaller g)

(Eq. 1's E_b(g), Thm 3.8 with measured costs; `choose_gamma`), each row offering
min(g*, room_b − 1), every PROBE_EVERY-th narrow decision replaced by the prior's own choice
(a row can come back after early rejections). A row at γ = 0 inside a wide call draws what
Algorithm 1 draws with no guess offered, so every decision is exact. If g* = 0 before the
first round it stays 0 (`never_speculates`) and the decode is the autoregressive loop. The
narrow round and one round per bucket are compiled once into one loop (`run_phases`): a
decision never recompiles, and a seed reproduces its tokens given the same table.
docs/auto_and_streaming.md holds the derivation, the measurements behind the prior and the
probes, and the reproducibility notes.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Dict, NamedTuple, Optional, Sequence, Tuple

import flax
import jax
import jax.numpy as jnp
import numpy as np

from specjax import files

PRIOR_ALPHA = 1.0
"""α of the one prior position in each row's estimate when the cost table holds no
measured α (optimistic: try before judging)."""
PRIOR_POSITIONS = 8.0
"""Weight, in verified positions of the batch, of a measured prior α (`CostTable.alpha`):
each row's estimate counts it as PRIOR_POSITIONS / batch positions (`prior_of`); about one
round of the widest default bucket (γ = 7) of evidence. With one position, a single
rejected first guess took a row of the bundled LM pair at T = 0 from the table's α = 0.94
to 0.47, and it stayed narrow for the rest of its decode although its guesses were right
92% of the time."""
PROBE_EVERY = 16
"""Narrow decisions (g* = 0) are replaced by the prior's own choice every PROBE_EVERY-th round
(module docstring, Probes)."""
SCHEDULE_ROUNDS = 64
"""Static length of the forced-γ schedule buffer (calibration, tests)."""
NO_LIMIT = np.iinfo(np.int32).max
VERSION = 2
READABLE_VERSIONS = (1, 2)  # 1: without `alpha`
TABLE_BYTES = 2**20
"""The largest cost table file read (a table is a few hundred bytes)."""


def default_buckets(max_gamma: int) -> Tuple[int, ...]:
  """1, 2, 4, ... below max_gamma, then max_gamma: (1, 2, 4, 7) for max_gamma = 7."""
  out, g = [], 1
  while g < max_gamma:
    out.append(g)
    g *= 2
  return tuple(out) + (max_gamma,)


def resolve_buckets(buckets: Sequence[int], max_gamma: int) -> Tuple[int, ...]:
  """The config's buckets (default when empty) with max_gamma appended; ValueError past it."""
  if not buckets:
    return default_buckets(max_gamma)
  if max(buckets) > max_gamma:
    raise ValueError(f"auto_buckets {tuple(buckets)} go past the drafter's max_gamma={max_gamma}")
  return tuple(sorted(set(buckets) | {max_gamma}))


# ------------------------------------------------------------------------- cost table


DESCRIBED_WHEN_SET = frozenset({"attention_impl"})
"""Config fields added after cost tables were first saved: described only when they differ
from their default, so a table saved before them still names the same models."""


def describe(obj) -> str:
  """A stable description of a model or drafter: dataclass fields and model configs, never
  an object address (it names what a saved cost table was measured on)."""
  if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
    fields = ", ".join(f"{f.name}={describe(getattr(obj, f.name))}"
                       for f in dataclasses.fields(obj)
                       if f.name not in DESCRIBED_WHEN_SET or getattr(obj, f.name) != f.default)
    return f"{type(obj).__name__}({fields})"
  config = getattr(obj, "config", None)
  if config is not None:
    return f"{type(obj).__name__}({describe(config)})"
  return repr(obj)


@dataclasses.dataclass(frozen=True)
class CostTable:
  """Seconds per round of each compiled round variant, for one (models, batch, cache length).

  `seconds[0]` is the narrow round (γ = 0: one 1-token target call); `seconds[i]` for
  i ≥ 1 the round of bucket `buckets[i-1]` with that many guesses.
  """

  batch: int
  cache_len: int
  max_gamma: int
  buckets: Tuple[int, ...]
  seconds: Tuple[float, ...]
  """float seconds per round, aligned with (0,) + buckets."""
  models: str = ""
  """What was measured (target and drafter), checked when a saved table is reused."""
  samples: Tuple[int, ...] = ()
  """Rounds timed per entry."""
  calibration_s: float = 0.0
  """Seconds the timed calibration runs took (the loop's compile excluded)."""
  platform: str = ""
  alpha: Optional[float] = None
  """Σ min(p, q) per verified position in the calibration's widest rounds (on the inputs
  calibrated on) of its slowest row, the one with the least: each row's prior α̂ under the
  policy (`prior_of`). None: PRIOR_ALPHA."""
  low: Tuple[float, ...] = ()
  """Per bucket: the lower quartile of its cost over the narrow round's, across the
  calibration's interleaved repeats (`auto.timing`); () for a table without them."""
  high: Tuple[float, ...] = ()
  """Per bucket: the upper quartile of the same."""
  real_ratio: Optional[float] = None
  """The widest bucket's round over a narrow round, timed on real rounds that move through the
  text (the check of the calibration); None: not checked."""
  recalibrations: int = 0
  """Calibrations repeated because the check disagreed."""
  recalibrated: bool = False
  """Whether the check still disagreed after them and its ratio rescaled the buckets."""

  def __post_init__(self):
    object.__setattr__(self, "buckets", tuple(int(b) for b in self.buckets))
    object.__setattr__(self, "seconds", tuple(float(s) for s in self.seconds))
    object.__setattr__(self, "samples", tuple(int(s) for s in self.samples))
    object.__setattr__(self, "low", tuple(float(s) for s in self.low))
    object.__setattr__(self, "high", tuple(float(s) for s in self.high))
    if len(self.seconds) != len(self.buckets) + 1:
      raise ValueError(f"cost table: {len(self.seconds)} costs for γ = 0 and buckets "
                       f"{self.buckets} (need {len(self.buckets) + 1})")
    if self.alpha is not None:
      object.__setattr__(self, "alpha", float(self.alpha))
      if not 0.0 <= self.alpha <= 1.0:
        raise ValueError(f"cost table: alpha must be in [0, 1] or None, got {self.alpha}")
    if not all(np.isfinite(s) and s > 0 for s in self.seconds):
      raise ValueError(f"cost table: every cost must be a positive number of seconds, got "
                       f"{self.seconds}")
    if not self.buckets or self.buckets[-1] != self.max_gamma or list(self.buckets) != sorted(
        set(self.buckets)) or self.buckets[0] < 1:
      raise ValueError(f"cost table: buckets must increase from >= 1 to max_gamma="
                       f"{self.max_gamma}, got {self.buckets}")

  def per_gamma(self) -> np.ndarray:
    """float32 [max_gamma + 1]: s[g], the cost of a round whose largest γ is g."""
    out = np.empty(self.max_gamma + 1, np.float32)
    out[0] = self.seconds[0]
    for g in range(1, self.max_gamma + 1):
      out[g] = self.seconds[1 + next(i for i, b in enumerate(self.buckets) if b >= g)]
    return out

  def relative(self) -> Dict[int, float]:
    """{γ: s[γ] / s[0]} for γ = 0 and each bucket (Thm 3.8's γc + 1, measured)."""
    return {g: s / self.seconds[0] for g, s in zip((0,) + self.buckets, self.seconds)}

  def seconds_per_token(self) -> Tuple[int, float]:
    """(γ, seconds per token) of the table's cheapest choice for a row at its α and an
    unbounded budget: argmin over γ = 0 and each bucket of s[γ] / E(α, γ) (Eq. 1; α None:
    PRIOR_ALPHA). Comparing two decodes' tables (a chain's and a tree's, say) at the same
    batch says which shape the policy's own prices favour."""
    alpha = PRIOR_ALPHA if self.alpha is None else self.alpha
    choices = [(g, s / float(np.sum(alpha ** np.arange(g + 1))))
               for g, s in zip((0,) + self.buckets, self.seconds)]
    return min(choices, key=lambda c: (c[1], c[0]))

  def summary(self) -> Dict[str, object]:
    """Flat, printable: ms per round and relative cost of each variant."""
    rel = self.relative()
    return {
        "cost_table": f"batch {self.batch}, cache {self.cache_len}, {self.platform}",
        "round_ms": ", ".join(f"γ={g}: {1e3 * s:.3g}" for g, s in
                              zip((0,) + self.buckets, self.seconds)),
        "round_cost_vs_ar": ", ".join(f"γ={g}: {r:.2f}" for g, r in rel.items()),
        "calibration_alpha": self.alpha,
        "calibration_s": self.calibration_s,
        **({"calibration": self.measured()} if self.real_ratio is not None else {}),
    }

  def measured(self) -> str:
    """What the calibration measured, in words: its repeats, the spread of each bucket's cost
    and the check on real rounds."""
    repeats = self.samples[0] if self.samples else 0
    spread = ", ".join(f"γ={g}: {lo:.2f}-{hi:.2f}" for g, lo, hi in
                       zip(self.buckets, self.low, self.high))
    text = (f"{repeats} timed rounds per variant over interleaved repeats, each cost the median "
            f"of its ratios to the narrow round (quartiles {spread})")
    if self.real_ratio is not None:
      wide = self.buckets[-1]
      text += (f"; checked on real rounds: a γ = {wide} round cost {self.real_ratio:.2f} narrow "
               f"rounds")
      if self.recalibrations:
        text += f", recalibrated {self.recalibrations} time(s)"
      if self.recalibrated:
        text += ", the real rounds' ratio kept"
    return text

  def check(self, *, batch: int, cache_len: int, max_gamma: int, buckets: Sequence[int],
            models: str) -> None:
    """ValueError naming the first way this table does not fit the decode it is given to."""
    for name, have, want in (("batch size", self.batch, batch),
                             ("cache length", self.cache_len, cache_len),
                             ("max_gamma", self.max_gamma, max_gamma),
                             ("buckets", self.buckets, tuple(buckets)),
                             ("models", self.models, models)):
      if have != want:
        raise ValueError(f"the cost table was calibrated for {name} {have!r}, but this decode "
                         f"has {want!r}: calibrate again (or pass a table made for it)")

  def to_json(self) -> Dict[str, object]:
    return {"version": VERSION, **dataclasses.asdict(self)}

  def save(self, path: str) -> None:
    """Writes the table as JSON, atomically and never through a link (`files.write_json`)."""
    files.write_json(path, self.to_json())

  @staticmethod
  def load(path: str) -> "CostTable":
    """Reads a table written by `save`; ValueError naming what is wrong with the file (a FIFO,
    a device, more than TABLE_BYTES, not JSON)."""
    try:
      data = files.read_json(path, TABLE_BYTES, "the file")
    except (OSError, ValueError) as e:
      raise ValueError(f"cost table '{path}' cannot be read: {e}") from e
    return CostTable.from_json(data, f"cost table '{path}'")

  @staticmethod
  def from_json(data: Any, what: str = "cost table") -> "CostTable":
    """The table of `to_json`'s dict; ValueError naming what is wrong with it."""
    if not isinstance(data, dict) or data.get("version") not in READABLE_VERSIONS:
      raise ValueError(f"{what} is not a specjax cost table (version "
                       f"{' or '.join(map(str, READABLE_VERSIONS))})")
    fields = {f.name for f in dataclasses.fields(CostTable)}
    unknown = set(data) - fields - {"version"}
    if unknown:
      raise ValueError(f"{what} has unknown fields {sorted(unknown)}")
    try:
      return CostTable(**{k: (tuple(v) if isinstance(v, list) else v)
                          for k, v in data.items() if k != "version"})
    except TypeError as e:
      raise ValueError(f"{what} is incomplete: {e}") from e


# ---------------------------------------------------------------------------- the policy


def choose_gamma(costs: jax.Array, alpha_sum: jax.Array, alpha_count: jax.Array,
                 active: jax.Array, room: jax.Array, gamma_cap: jax.Array,
                 prior: Any = PRIOR_ALPHA, prior_weight: Any = 1.0) -> jax.Array:
  """Each row's γ for the next round (see the module docstring).

  costs: float32 [G+1] (`CostTable.per_gamma`); alpha_sum float32 [B], alpha_count int32 [B]
  (the running α estimate); active bool [B]; room int32 [B] (tokens left in the row's
  budget); gamma_cap int32 [] (the largest γ allowed); prior float32 [] (α of the estimate's prior
  positions); prior_weight float32 [] (how many positions the prior counts as)
  -> int32 [B] in [0, G].
  """
  max_gamma = costs.shape[0] - 1
  alpha = jnp.clip((alpha_sum + prior_weight * prior) / (alpha_count + prior_weight),
                   0.0, 1.0)  # [B]
  gammas = jnp.arange(max_gamma + 1)
  tokens = jnp.cumsum(alpha[:, None] ** gammas[None, :], axis=1)  # [B, G+1]: E(α, γ), Eq. 1
  offered = jnp.minimum(gammas[None, :], jnp.maximum(room - 1, 0)[:, None])  # [B, G+1]
  rounds = room[:, None] / jnp.take_along_axis(tokens, offered, axis=1)  # [B, G+1]
  slowest = jnp.max(jnp.where(active[:, None], rounds, 0.0), axis=0)  # [G+1]
  remaining = jnp.where(gammas <= gamma_cap, costs * slowest, jnp.inf)
  best = jnp.argmin(remaining).astype(jnp.int32)
  return jnp.where(active, jnp.minimum(best, jnp.maximum(room - 1, 0)), 0).astype(jnp.int32)


def prior_of(costs: "CostTable") -> Tuple[float, float]:
  """(α, weight in positions) of each row's prior under this table: its measured α at
  PRIOR_POSITIONS / batch positions, or PRIOR_ALPHA at one position when it has none.

  The prior speaks for the batch's slowest row (the table's α is its calibration batch's
  least), and the decision follows that row; a batch of B rows gathers B rows' evidence per
  round, so the prior is worth PRIOR_POSITIONS positions of the batch's evidence, split over
  its rows. Measured on the bundled LM pair at T = 0: 8 positions per row at batch 8 kept a
  batch whose rows' α range from 0.54 to 1 speculating for most of its decode (0.90x
  autoregressive, where every fixed γ loses); at batch 1 one position ended a good row's
  speculation on its first rejection (module docstring)."""
  if costs.alpha is None:
    return PRIOR_ALPHA, 1.0
  return costs.alpha, PRIOR_POSITIONS / costs.batch


@functools.lru_cache(maxsize=256)
def never_speculates(costs: "CostTable", gamma_cap: int, max_new_tokens: int) -> bool:
  """Whether the policy, deciding with `costs`, plays only γ = 0 rounds in a whole decode
  of max_new_tokens per row (module docstring: its choice for one row at the table's α and
  the full budget, which stands for the rest of the decode)."""
  prior, weight = prior_of(costs)
  gamma = choose_gamma(jnp.asarray(costs.per_gamma()), jnp.zeros(1, jnp.float32),
                       jnp.zeros(1, jnp.int32), jnp.ones(1, bool),
                       jnp.full(1, max_new_tokens, jnp.int32), jnp.int32(gamma_cap),
                       jnp.float32(prior), jnp.float32(weight))
  return int(gamma[0]) == 0


def forced_gamma(gamma: jax.Array, active: jax.Array, room: jax.Array) -> jax.Array:
  """A scheduled batch γ [] applied per row as the policy would: int32 [B]."""
  return jnp.where(active, jnp.minimum(gamma, jnp.maximum(room - 1, 0)), 0).astype(jnp.int32)


def branch_index(gamma: jax.Array, buckets: Tuple[int, ...]) -> jax.Array:
  """The round variant for the rows' γ [B]: 0 narrow, i ≥ 1 bucket i-1 (the smallest ≥ max γ)."""
  most = jnp.max(gamma)
  return jnp.where(most > 0, 1 + jnp.searchsorted(jnp.asarray(buckets), most, side="left"),
                   0).astype(jnp.int32)


def run_phases(variants: Sequence[Callable], decide: Callable, running: Callable, state,
               stands: Optional[Tuple[Callable, Callable]] = None):
  """Runs rounds while they are wanted, each variant in its own inner `while_loop`.

  variants[v](state, gamma) plays one round; decide(state) -> (gamma int32 [B], v int32 [])
  picks the next round; running(state) says whether the decode goes on. Inner loop v runs
  rounds while the decision stays v, so one call of this (the outer loop's body) makes at
  least one round. Each variant sits directly in a loop body, not in a `lax.cond` /
  `lax.switch` branch nor a 0/1-trip loop: measured in the compiled HLO, conditionals copy
  every KV-cache array per branch, and in both the decode step's loop-invariant work (its
  concatenated kernels) is redone every round, where a loop body has it hoisted out.
  The decision is carried beside the state: it is made once per round (after the round,
  for the next one) and read by the loops' conditions, not recomputed by each.

  stands = (mark, holds): for variants[0] (the narrow round). mark(state) is a small pytree
  taken when the decision is made and holds(mark, state) -> bool [] says whether that
  decision still holds after further rounds without being recomputed. Narrow rounds then
  follow each other in an inner loop with no decision between them; `decide` runs again
  once `holds` fails or `running` stops. (Only the mark enters the inner loop: a state
  kept alive beside the one the rounds update would make XLA copy its caches.)
  None: decide after every round.
  """
  def body(carry, f):
    after = f(carry[0], carry[1])
    return (after,) + tuple(decide(after))

  def narrow_body(carry, f):
    gamma, mark = carry[1], stands[0](carry[0])
    after = jax.lax.while_loop(lambda s: running(s) & stands[1](mark, s),
                               lambda s: f(s, gamma), f(carry[0], gamma))
    return (after,) + tuple(decide(after))

  carry = (state,) + tuple(decide(state))
  for index, variant in enumerate(variants):
    step = narrow_body if index == 0 and stands is not None else body
    carry = jax.lax.while_loop(
        lambda c, i=index: running(c[0]) & (c[2] == i),
        functools.partial(step, f=variant), carry)
  return carry[0]


class AutoSpec(NamedTuple):
  """What the runner reads of a loop under the 'auto' policy (its optional `auto` member;
  None, or absent, when the policy is off)."""
  buckets: Tuple[int, ...]
  """The γ of each compiled wide-round variant."""
  alpha_rounds: Optional[int]
  """Rounds of the calibration's α run (None: as many as it times)."""
  fallback: Any
  """The autoregressive loop the decode runs instead when the policy never speculates (its
  result is reported as γ = 0 rounds)."""


@flax.struct.dataclass
class AutoControl:
  """The data the 'auto' loop reads besides its state (changing it never recompiles)."""

  costs: jax.Array  # float32 [G+1]: s[g] per largest γ (`CostTable.per_gamma`)
  gamma_cap: jax.Array  # int32 []: the largest γ the policy may pick
  schedule: jax.Array  # int32 [SCHEDULE_ROUNDS]: forced batch γ of round r (-1: the policy)
  max_rounds: jax.Array  # int32 []: stop after this many rounds (calibration)
  rollback: jax.Array  # bool []: undo every round's commit (calibration: rows never move)
  prior: jax.Array  # float32 []: α of each row's prior positions (`prior_of`)
  prior_weight: jax.Array  # float32 []: how many positions the prior counts as

  @staticmethod
  def make(costs, gamma_cap: int, schedule: Sequence[int] = (), max_rounds: int = NO_LIMIT,
           rollback: bool = False, prior: Optional[float] = None,
           prior_weight: float = 1.0) -> "AutoControl":
    if len(schedule) > SCHEDULE_ROUNDS:
      raise ValueError(f"a schedule holds at most {SCHEDULE_ROUNDS} rounds, got {len(schedule)}")
    padded = np.full(SCHEDULE_ROUNDS, -1, np.int32)
    padded[:len(schedule)] = schedule
    return AutoControl(costs=jnp.asarray(costs, jnp.float32), gamma_cap=jnp.int32(gamma_cap),
                       schedule=jnp.asarray(padded), max_rounds=jnp.int32(max_rounds),
                       rollback=jnp.bool_(rollback),
                       prior=jnp.float32(PRIOR_ALPHA if prior is None else prior),
                       prior_weight=jnp.float32(prior_weight))
