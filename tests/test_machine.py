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
