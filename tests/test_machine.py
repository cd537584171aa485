"""specjax.machine: the CPU line a timing is read against, from made-up /proc/cpuinfo lines."""
import os

from specjax import machine

AVX2_ONLY = ["processor\t: 0", "model name\t: AMD EPYC", "flags\t\t: fpu sse avx avx2 fma"]
GENOA = ["model name\t: AMD EPYC 9B14",
         "flags\t\t: avx avx2 avx512f avx512_vnni avx512_bf16 sha_ni"]


def test_an_avx2_cpu_is_named_without_bfloat16_and_int8_dots():
  assert machine.cpu_model(AVX2_ONLY) == "AMD EPYC"
  assert machine.dot_flags(AVX2_ONLY) == ["avx2"]
  assert machine.describe(AVX2_ONLY) == (
      f"AMD EPYC, {os.cpu_count()} cores, avx2 (no avx512_bf16, no vnni)")


def test_an_avx512_bf16_cpu_lists_its_dot_flags_in_order():
  assert machine.dot_flags(GENOA) == ["avx2", "avx512f", "avx512_bf16", "avx512_vnni"]
  assert machine.describe(GENOA).endswith("cores, avx2 avx512f avx512_bf16 avx512_vnni")


def test_no_cpuinfo_falls_back_to_the_model_alone():
  assert machine.dot_flags([]) is None
  assert machine.describe([]).endswith(f", {os.cpu_count()} cores")


def test_a_draft_runs_int8_on_every_cpu_and_bfloat16_on_an_accelerator():
  # Measured faster in int8 on an AVX2-only EPYC and on an avx512_bf16 / AMX Xeon alike.
  assert machine.draft_weights_dtype("cpu", GENOA)[0] == "int8"
  assert "weight bytes" in machine.draft_weights_dtype("cpu", GENOA)[1]
  assert "(avx512_bf16)" in machine.draft_weights_dtype("cpu", GENOA)[1]
  assert machine.draft_weights_dtype("cpu", AVX2_ONLY) == (
      "int8", "this CPU has no bfloat16 dot instructions (no avx512_bf16 or amx_bf16): int8 "
      "reads half of bfloat16's weight bytes without converting them")
  assert machine.draft_weights_dtype("cpu", [])[0] == "int8"
  assert machine.draft_weights_dtype("gpu", AVX2_ONLY) == (
      "bfloat16", "the GPU runs bfloat16 dots natively")
  assert machine.draft_weights_dtype("tpu")[0] == "bfloat16"
