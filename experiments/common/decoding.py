"""The experiments' decode settings and drafter."""
from __future__ import annotations

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
