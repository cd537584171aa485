"""The experiments' decode settings, drafter and decoders."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from experiments.common.pairs import Pair

def decode_config(temperature: float, cache_len: int, lenience: float = 1.0,
                  trace: bool = False, eos_id: int = -1):
  """DecodeConfig for experiments. eos_id -1 (default) generates the full budget, so
  timings compare equal lengths; texts are cut at the first EOS afterwards."""
  from specjax.decode import DecodeConfig  # pylint: disable=import-outside-toplevel
  from specjax.sampling import Sampling  # pylint: disable=import-outside-toplevel
  return DecodeConfig(sampling=Sampling(temperature=float(temperature)), eos_id=eos_id,
                      lenience=lenience, trace=trace, cache_len=cache_len)


def model_drafter(pair: Pair, max_gamma: int):
  """(ModelDrafter of the pair's draft, its params)."""
  from specjax.draft import ModelDrafter  # pylint: disable=import-outside-toplevel
  return ModelDrafter(pair.draft, max_gamma=max_gamma), pair.draft_params


def verifier_label(verifier: Any) -> str:
  """A verifier's name in a table row: its description, or the sigmoid's scales."""
  from specjax.verify import describe  # pylint: disable=import-outside-toplevel
  if verifier.exact:
    return describe(verifier)
  return f"sigmoid α=−β={-verifier.alpha:g} (NOT EXACT)"


Decoder = Callable[..., Any]
"""fn(inputs int32 [B, W], **kw) -> DecodeResult; kw: more arguments of the decode call
(they win over the entry's)."""


@dataclasses.dataclass(frozen=True)
class Decoders:
  """The named decoders of an experiment, on one pair's target with one budget, config and key:

    d = Decoders(pair, max_new_tokens=64, config=decode_config(0.0, 128))
    runs = {"autoregressive": d.autoregressive(), "chain γ=4": d.model_chain(4),
            "tree": d.tree(pair.draft, pair.draft_params, tree=StaticTree.from_spines((4, 1)))}

  Each entry is a `Decoder`; `auto()` is the same set under the 'auto' γ policy."""
  pair: Pair
  max_new_tokens: int
  config: Any
  rng: Any = None
  """The decodes' key (None: `jax.random.PRNGKey(0)`)."""

  def _call(self, decode: Callable[..., Any], *args: Any, **kw: Any) -> Decoder:
    import jax  # pylint: disable=import-outside-toplevel
    rng = jax.random.PRNGKey(0) if self.rng is None else self.rng
    base = dict(max_new_tokens=self.max_new_tokens, rng=rng, config=self.config, **kw)
    target, params = self.pair.target, self.pair.target_params

    def run(x, **more: Any) -> Any:
      return decode(target, params, *args, x, **{**base, **more})
    return run

  def autoregressive(self, **kw: Any) -> Decoder:
    """The target alone."""
    from specjax.decode import autoregressive_decode  # pylint: disable=import-outside-toplevel
    return self._call(autoregressive_decode, **kw)

  def chain(self, drafter: Any, params: Any, gamma: Any, **kw: Any) -> Decoder:
    """Speculative decoding with `drafter` (its `params`) at γ = `gamma` (None: the policy's)."""
    from specjax.decode import speculative_decode  # pylint: disable=import-outside-toplevel
    return self._call(speculative_decode, drafter, params, gamma=gamma, **kw)

  def model_chain(self, gamma: int, **kw: Any) -> Decoder:
    """`chain` with the pair's draft model, its max_gamma = γ (a (γ+1)-token target call)."""
    return self.chain(*model_drafter(self.pair, gamma), gamma, **kw)

  def tree(self, drafter: Any, params: Any, **kw: Any) -> Decoder:
    """Token-tree decoding with `drafter` (a tree drafter, or a model with `tree=`)."""
    from specjax.decode import tree_decode  # pylint: disable=import-outside-toplevel
    return self._call(tree_decode, drafter, params, **kw)

  def auto(self) -> "Decoders":
    """These decoders under the 'auto' γ policy."""
    return dataclasses.replace(self, config=dataclasses.replace(self.config,
                                                                gamma_policy="auto"))


def join(results: Any) -> Any:
  """The rows of DecodeResults (a sequence) joined along the batch axis; a scalar field is the
  first result's."""
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  return jax.tree.map(lambda *x: np.concatenate(x) if np.ndim(x[0]) else x[0], *results)


def in_batches(decode: Callable[[Any, int], Any], inputs: Any, batch: int) -> Any:
  """`decode(rows [batch, W], start)` over consecutive batches of `batch` rows of `inputs`
  [N, W] (the last padded by repeating its first row: one compiled shape), the real rows'
  results joined along the batch axis. Its `rounds` is Σ over the batches of their slowest
  row's target calls (a padded batch runs until its slowest row is done), `slot_rounds`
  rounds × batch."""
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from experiments.common.inputs import pad_rows  # pylint: disable=import-outside-toplevel
  outs, rounds = [], 0
  for start in range(0, len(inputs), batch):
    real = min(batch, len(inputs) - start)
    out = decode(pad_rows(inputs[start:start + batch], batch), start)
    rounds += int(np.max(np.asarray(out.target_calls)[:real]))
    outs.append(jax.tree.map(lambda x, real=real: x[:real] if np.ndim(x) else x, out))
  return join(outs).replace(rounds=np.int32(rounds), slot_rounds=np.int32(rounds * batch))
