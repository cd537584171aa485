"""The machine a measurement ran on, in one line: CPU model, cores, and the vector extensions
that decide which weight dtype is fastest on the CPU.

XLA:CPU runs a bfloat16 dot fast only where the CPU has bfloat16 dot instructions
(avx512_bf16, amx_bf16), and an int8 one where it has int8 dot-product instructions
(avx512_vnni, avx_vnni, amx_int8); elsewhere both convert and can be slower than float32.
A CPU timing is read against that line.
"""
from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

DOT_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16", "amx_int8")
"""/proc/cpuinfo flags named in `describe`, in this order."""


def _cpuinfo(path: Path = Path("/proc/cpuinfo")) -> List[str]:
  try:
    return path.read_text().splitlines()
  except OSError:
    return []


def cpu_model(lines: Optional[Sequence[str]] = None) -> str:
  """The CPU's model name (/proc/cpuinfo), else platform.processor(), else 'unknown CPU'."""
  for line in _cpuinfo() if lines is None else lines:
    if line.startswith("model name"):
      return line.split(":", 1)[1].strip()
  return platform.processor() or "unknown CPU"


def dot_flags(lines: Optional[Sequence[str]] = None) -> Optional[List[str]]:
  """The `DOT_FLAGS` the CPU has, in that order; None where /proc/cpuinfo lists no flags."""
  for line in _cpuinfo() if lines is None else lines:
    if line.startswith("flags"):
      have = set(line.split(":", 1)[1].split())
      return [flag for flag in DOT_FLAGS if flag in have]
  return None


def describe(lines: Optional[Sequence[str]] = None) -> str:
  """E.g. 'AMD EPYC, 2 cores, avx2 (no avx512_bf16, no vnni)': the vnni flags
  are int8 dot-product instructions."""
  flags = dot_flags(lines)
  text = f"{cpu_model(lines)}, {os.cpu_count()} cores"
  if flags is None:
    return text
  notes = [] if "avx512_bf16" in flags or "amx_bf16" in flags else ["no avx512_bf16"]
  if not {"avx512_vnni", "avx_vnni", "amx_int8"} & set(flags):
    notes.append("no vnni")
  listed = " ".join(flags) or "no AVX2"
  return text + f", {listed}" + (f" ({', '.join(notes)})" if notes else "")


BF16_DOT_FLAGS = ("avx512_bf16", "amx_bf16")
"""CPU flags of bfloat16 dot instructions: XLA:CPU's bfloat16 dots are fast only with them."""


def draft_weights_dtype(backend: str, lines: Optional[Sequence[str]] = None) -> Tuple[str, str]:
  """(dtype, why): the weight dtype a draft (a model or a feature head) runs fastest in here.

  A draft's step at batch 1 reads its weights once per guess and does little else, so it is
  bound by its weight bytes. A GPU or TPU multiplies bfloat16 natively: 'bfloat16'. On a CPU
  'int8' (half of bfloat16's bytes, one scale per output column): it was the faster of the two
  both where the CPU has no bfloat16 dot instructions (`BF16_DOT_FLAGS`; bfloat16 is converted
  element by element there) and where it has them (an avx512_bf16 / AMX Xeon: the LM head's
  main job 2.30-2.37x in int8 against 2.04-2.09x in bfloat16, interleaved;
  docs/results/main_eagle/README.md, "The avx512_bf16 / AMX Xeon"). Where the CPU's flags
  cannot be read, 'int8' too. `backend` is `jax.default_backend()`.
  """
  if backend != "cpu":
    return "bfloat16", f"the {backend.upper()} runs bfloat16 dots natively"
  flags = dot_flags(lines)
  if flags is None:
    return "int8", "this CPU's flags are unreadable (no /proc/cpuinfo): int8, the CPU default"
  have = [flag for flag in BF16_DOT_FLAGS if flag in flags]
  if have:
    return "int8", (f"a head's step is bound by its weight bytes, and int8 reads half of "
                    f"bfloat16's: faster than bfloat16 even with bfloat16 dot instructions "
                    f"({', '.join(have)})")
  return "int8", ("this CPU has no bfloat16 dot instructions (no avx512_bf16 or amx_bf16): "
                  "int8 reads half of bfloat16's weight bytes without converting them")
