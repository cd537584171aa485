"""Strings in, texts out: speculative decoding from Python, with the main job's loading.

    import specjax
    out = specjax.generate(["This package provides", "A library for"], pair="bundled:lm")
    print(out.texts, [row.alpha for row in out.rows])

    gen = specjax.Generator("bundled:lm", drafter="prompt_lookup")   # loaded once
    gen(["..."]); gen(["..."], max_new_tokens=16)                    # compiled once per shape
    print(gen.compare(["..."]))                                      # the speedup, measured

A pair is 'bundled:lm' or 'bundled:translate' (the shipped pairs, run as `runs/default.gin`
and `runs/bundled_translate.gin` run them), or a gin file describing two checkpoints (such as
docs/own_t5x.md's `my_t5.gin`, or `runs/random_tiny.gin`). Settings are the main job's
(`decode_job`'s keywords: gamma, drafter, sampling, gamma_policy, max_new_tokens,
batch_size, weights_dtype, verifier, tree, ...) over what the gin binds; `bindings` take gin
strings as `--gin.NAME=VALUE` does. Building a `Generator` parses that gin (replacing the
process's gin configuration, as the main job does), builds and checks the models, and loads
their weights; each call then frames its texts and runs the speculative loop.
"""
from __future__ import annotations

import dataclasses
import difflib
import re
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

import gin
import numpy as np

from specjax import timing
from specjax.app import gin_config
from specjax.app.job import decode_job
from specjax.app.measure import Loaded, decoders, load_weights
from specjax.app.plan import Pair, build_pair, make_plan, token_ranking
from specjax.app.report import per_token_speedup
from specjax.app.settings import JobSettings
from specjax.decode import DecodeResult

__all__ = ["generate", "Generator", "Generation", "Row", "Comparison", "PAIR_RUNS"]

PAIR_RUNS = {"bundled:lm": "runs/default.gin", "bundled:translate": "runs/bundled_translate.gin"}
"""A bundled pair -> the run file that configures it (its batch, dtypes, γ and policy)."""

_NOT_SETTINGS = ("texts", "console", "on_batch", "settings_only", "output_dir", "plain",
                 "task_vocabulary", "write_scores", "timing_repeats", "note")
"""`decode_job` keywords that are the main job's own (printing, files, timing), not a setting
of the decode."""


@dataclasses.dataclass(frozen=True)
class Row:
  """One input's figures from its speculative decode."""

  tokens: int  # tokens emitted (an EOS counted)
  target_calls: int  # calls of the target (rounds)
  alpha: float  # the draft's agreement Σ min(p, q) per verified position (0: none verified)

  @property
  def tokens_per_call(self) -> float:
    """Tokens each target call bought."""
    return self.tokens / max(self.target_calls, 1)


@dataclasses.dataclass(frozen=True)
class Generation(Sequence[str]):
  """The texts of one `Generator` call (also indexable and iterable as them), their token ids
  and per-row figures, and the loop's `DecodeResult`."""

  texts: List[str]  # the outputs, decoded through the first EOS
  tokens: List[List[int]]  # their ids (an emitted EOS included)
  rows: List[Row]  # per input
  result: DecodeResult  # the loop's own result (tokens [N, max_new_tokens], stats per row)

  def __len__(self) -> int:
    return len(self.texts)

  def __getitem__(self, index):
    return self.texts[index]

  def __iter__(self) -> Iterator[str]:
    return iter(self.texts)

  @property
  def tokens_per_call(self) -> float:
    """Tokens per target call over every row."""
    return sum(r.tokens for r in self.rows) / max(sum(r.target_calls for r in self.rows), 1)


@dataclasses.dataclass(frozen=True)
class Comparison:
  """`Generator.compare`: the speculative decode beside the target alone, timed pass by pass
  (`specjax.timing.interleaved`) after a first untimed run of each (compiling)."""

  speedup: float  # ms per emitted token, autoregressive / speculative, of the medians
  low: float  # the same ratio's lowest pass
  high: float  # and its highest
  autoregressive_ms_per_token: float
  speculative_ms_per_token: float
  tokens_per_call: float  # of the speculative decode
  identical: bool  # whether the two decodes emitted the same tokens (greedy: they should)

  def __str__(self) -> str:
    return (f"speedup {self.speedup:.2f}x ({self.low:.2f}-{self.high:.2f} pass by pass): "
            f"{self.autoregressive_ms_per_token:.2f} ms per token autoregressive, "
            f"{self.speculative_ms_per_token:.2f} speculative, "
            f"{self.tokens_per_call:.2f} tokens per target call")


def run_files(pair: Optional[str], gin_files: Sequence[str]) -> List[str]:
  """The gin files of a pair ('bundled:NAME' or a gin file; None: `gin_files` alone)."""
  if pair is None:
    if not gin_files:
      raise ValueError("no pair: give pair='bundled:lm', 'bundled:translate' or a gin file "
                       "describing two checkpoints (or gin_files=[...])")
    return list(gin_files)
  if pair.startswith("bundled:"):
    if pair not in PAIR_RUNS:
      raise ValueError(f"unknown bundled pair {pair!r}; expected one of {sorted(PAIR_RUNS)} "
                       "(or a gin file describing two checkpoints)")
    return [PAIR_RUNS[pair], *gin_files]
  return [pair, *gin_files]


def gin_settings(overrides: Dict[str, Any]) -> JobSettings:
  """The `JobSettings` the parsed gin binds to `decode_job`, with `overrides` (its keywords)
  on top, checked as the main job checks them; nothing written, nothing timed."""
  for name in overrides:
    if name in _NOT_SETTINGS:
      raise ValueError(f"{name!r} is the main job's, not a setting of generate (its outputs "
                       "are returned, not printed or written)")
  job = gin.get_configurable(decode_job)
  try:
    return job((), settings_only=True, output_dir=None, **overrides)
  except TypeError as e:
    unbound = gin_config.unbound_macro(e)
    if unbound is not None:
      raise unbound from e
    unknown = re.search(r"unexpected keyword argument '(\w+)'", str(e))
    if unknown is None:
      raise
    close = difflib.get_close_matches(unknown.group(1), gin.get_bindings(decode_job), 1)
    raise ValueError(f"no setting {unknown.group(1)!r}" +
                     (f" (did you mean {close[0]!r}?)" if close else "") +
                     ": the settings are decode_job's keywords (gamma, drafter, sampling, "
                     "gamma_policy, max_new_tokens, batch_size, ...)") from e


class Generator:
  """A loaded target/draft pair, decoding texts speculatively call after call.

  Args:
    pair: 'bundled:lm' (the default), 'bundled:translate', or a gin file describing two
      checkpoints (a run file including runs/decode.gin); None: `gin_files` alone.
    gin_files: more gin files, parsed after the pair's (decoding/sampling.gin, ...).
    bindings: gin bindings as strings, `["GAMMA=5", "VERIFIER=@BlockVerifier()"]`.
    gin_search_paths: more folders for gin files and their includes.
    **settings: `decode_job` keywords over the gin's (gamma=3, drafter='prompt_lookup',
      sampling=specjax.Sampling(temperature=1.0), max_new_tokens=64, batch_size=4, ...).
  """

  def __init__(self, pair: Optional[str] = "bundled:lm", *, gin_files: Sequence[str] = (),
               bindings: Sequence[str] = (), gin_search_paths: Sequence[str] = (),
               **settings: Any):
    files = run_files(pair, list(gin_files))
    paths = list(gin_search_paths)
    gin_config.parse(gin_config.run_files(files, PAIR_RUNS["bundled:lm"], paths),
                     list(bindings), paths)
    self.pair: Pair = build_pair(gin_settings(settings))
    self.settings: JobSettings = self.pair.settings
    self.loaded: Loaded = load_weights(self.settings, self.pair.target, self.pair.draft,
                                       self.pair.drafter, self.pair.checkpoints,
                                       token_ranking(self.pair))
    self.costs = None  # the 'auto' policy's cost table, measured on the first call

  def _plan(self, texts: Sequence[Union[str, Any]], max_new_tokens: Optional[int],
            seed: Optional[int]):
    if isinstance(texts, str):
      raise ValueError("texts must be a list of strings (got one string: wrap it in a list)")
    settings = dataclasses.replace(
        self.settings,
        max_new_tokens=self.settings.max_new_tokens if max_new_tokens is None
        else max_new_tokens,
        seed=self.settings.seed if seed is None else seed)  # checked as it is made
    return make_plan(texts, settings, self.pair)

  def __call__(self, texts: Sequence[str], *, max_new_tokens: Optional[int] = None,
               seed: Optional[int] = None) -> Generation:
    """The speculative decode of `texts` (a list of strings: prompts, or a T5's sources), in
    batches of the settings' batch_size. `max_new_tokens` and `seed` change this call alone."""
    plan = self._plan(texts, max_new_tokens, seed)
    result = decoders(plan, self.loaded, self.costs, trace=False)["spec"]()
    self._keep_costs(plan, result)
    return self._generation(plan, result)

  def _keep_costs(self, plan, result: DecodeResult) -> None:
    if plan.settings.decoding.gamma_policy == "auto" and self.costs is None:
      self.costs = result.cost_table

  def _generation(self, plan, result: DecodeResult) -> Generation:
    """A `Generation` of a decode `result` of the plan's inputs."""
    vocab, lengths = self.pair.vocab, np.asarray(result.lengths)
    ids = [np.asarray(result.tokens[i, :int(lengths[i])]).tolist() for i in range(len(lengths))]
    rows = [Row(tokens=int(lengths[i]), target_calls=int(result.target_calls[i]),
                alpha=float(result.alpha[i])) for i in range(len(lengths))]
    return Generation(texts=[vocab.decode(r) for r in ids], tokens=ids, rows=rows,
                      result=result)

  def compare(self, texts: Sequence[str], *, repeats: int = 3,
              max_new_tokens: Optional[int] = None) -> Comparison:
    """The speedup of the speculative decode of `texts` over the target's autoregressive one.

    Each decode runs once (compiling; 'auto' calibrating), then `repeats` interleaved timed
    passes, as the main job measures its speedup."""
    plan = self._plan(texts, max_new_tokens, None)
    fns = decoders(plan, self.loaded, self.costs, trace=False)
    fns["ar"]()
    self._keep_costs(plan, fns["spec"]())
    fns = decoders(plan, self.loaded, self.costs, trace=False)
    timings = timing.interleaved(fns, repeats, warmup=False)
    ar, spec = timings.outputs["ar"], timings.outputs["spec"]
    ar_tokens, spec_tokens = int(np.sum(ar.lengths)), int(np.sum(spec.lengths))
    speedup, low, high = per_token_speedup(timings, ar_tokens, spec_tokens)
    same = (np.array_equal(np.asarray(ar.lengths), np.asarray(spec.lengths))
            and all(np.array_equal(np.asarray(ar.tokens[i, :int(n)]),
                                   np.asarray(spec.tokens[i, :int(n)]))
                    for i, n in enumerate(np.asarray(ar.lengths))))
    return Comparison(
        speedup=speedup, low=low, high=high,
        autoregressive_ms_per_token=1e3 * timings.median("ar") / max(ar_tokens, 1),
        speculative_ms_per_token=1e3 * timings.median("spec") / max(spec_tokens, 1),
        tokens_per_call=self._generation(plan, spec).tokens_per_call, identical=bool(same))


def generate(texts: Sequence[str], pair: Optional[str] = "bundled:lm", **settings: Any
             ) -> Generation:
  """`Generator(pair, **settings)(texts)`: the texts decoded speculatively, with per-row
  figures (`Generation.rows`: tokens, target calls, α). Keep a `Generator` to decode again
  without loading and compiling again."""
  return Generator(pair, **settings)(texts)
