"""The step-time model (`specjax.aot.cost`) on a hand-written program against arithmetic: one
GEMM, one elementwise kernel, one in-place cache write, one embedding-row read, in a loop of
known trips with a nested loop. Runs everywhere (no compiler needed)."""
import pytest

from specjax import analysis
from specjax.aot import cost

M, K, N = 512, 4096, 8192  # a GEMM big enough to be bound by its FLOPs on the device below

PROGRAM = f"""HloModule jit_steps

%gemm_computation (a: bf16[{M},{K}], b: bf16[{K},{N}]) -> bf16[{M},{N}] {{
  %a = bf16[{M},{K}]{{1,0}} parameter(0)
  %b = bf16[{K},{N}]{{1,0}} parameter(1)
  ROOT %d = bf16[{M},{N}]{{1,0}} dot(%a, %b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
}}

%tanh_computation (x: bf16[{M},{N}]) -> bf16[{M},{N}] {{
  %x = bf16[{M},{N}]{{1,0}} parameter(0)
  ROOT %t = bf16[{M},{N}]{{1,0}} tanh(%x)
}}

%write_computation (c: bf16[128,{N}], u: bf16[1,{N}], i: s32[]) -> bf16[128,{N}] {{
  %c = bf16[128,{N}]{{1,0}} parameter(0)
  %u = bf16[1,{N}]{{1,0}} parameter(1)
  %i = s32[] parameter(2)
  %z = s32[] constant(0)
  ROOT %w = bf16[128,{N}]{{1,0}} dynamic-update-slice(%c, %u, %i, %z)
}}

%row_computation (e: f32[1000,{K}], i: s32[]) -> f32[1,{K}] {{
  %e = f32[1000,{K}]{{1,0}} parameter(0)
  %i = s32[] parameter(1)
  %z = s32[] constant(0)
  ROOT %r = f32[1,{K}]{{1,0}} dynamic-slice(%e, %i, %z), dynamic_slice_sizes={{1,{K}}}
}}

%inner_body (s: (s32[], bf16[1,{N}])) -> (s32[], bf16[1,{N}]) {{
  %s = (s32[], bf16[1,{N}]{{1,0}}) parameter(0)
  %j = s32[] get-tuple-element(%s), index=0
  %v = bf16[1,{N}]{{1,0}} get-tuple-element(%s), index=1
  %v2 = bf16[1,{N}]{{1,0}} fusion(%v), kind=kLoop, calls=%tanh_small
  ROOT %o = (s32[], bf16[1,{N}]{{1,0}}) tuple(%j, %v2)
}}

%tanh_small (x: bf16[1,{N}]) -> bf16[1,{N}] {{
  %x = bf16[1,{N}]{{1,0}} parameter(0)
  ROOT %t = bf16[1,{N}]{{1,0}} tanh(%x)
}}

%inner_cond (s: (s32[], bf16[1,{N}])) -> pred[] {{
  %s = (s32[], bf16[1,{N}]{{1,0}}) parameter(0)
  %j = s32[] get-tuple-element(%s), index=0
  %k = s32[] constant(3)
  ROOT %lt = pred[] compare(%j, %k), direction=LT
}}

%body (s: (s32[], bf16[{M},{K}], bf16[{K},{N}], bf16[128,{N}], f32[1000,{K}])) -> (s32[], bf16[{M},{K}], bf16[{K},{N}], bf16[128,{N}], f32[1000,{K}]) {{
  %s = (s32[], bf16[{M},{K}]{{1,0}}, bf16[{K},{N}]{{1,0}}, bf16[128,{N}]{{1,0}}, f32[1000,{K}]{{1,0}}) parameter(0)
  %i = s32[] get-tuple-element(%s), index=0
  %a = bf16[{M},{K}]{{1,0}} get-tuple-element(%s), index=1
  %b = bf16[{K},{N}]{{1,0}} get-tuple-element(%s), index=2
  %c = bf16[128,{N}]{{1,0}} get-tuple-element(%s), index=3
  %e = f32[1000,{K}]{{1,0}} get-tuple-element(%s), index=4
  %g = bf16[{M},{N}]{{1,0}} fusion(%a, %b), kind=kCustom, calls=%gemm_computation
  %t = bf16[{M},{N}]{{1,0}} fusion(%g), kind=kLoop, calls=%tanh_computation
  %u = bf16[1,{N}]{{1,0}} slice(%t), slice={{[0:1], [0:{N}]}}
  %w = bf16[128,{N}]{{1,0}} fusion(%c, %u, %i), kind=kLoop, calls=%write_computation
  %r = f32[1,{K}]{{1,0}} fusion(%e, %i), kind=kLoop, calls=%row_computation
  %zero = s32[] constant(0)
  %init = (s32[], bf16[1,{N}]{{1,0}}) tuple(%zero, %u)
  %inner = (s32[], bf16[1,{N}]{{1,0}}) while(%init), condition=%inner_cond, body=%inner_body, backend_config={{"known_trip_count":{{"n":"3"}}}}
  ROOT %o = (s32[], bf16[{M},{K}]{{1,0}}, bf16[{K},{N}]{{1,0}}, bf16[128,{N}]{{1,0}}, f32[1000,{K}]{{1,0}}) tuple(%i, %a, %b, %w, %e)
}}

%cond (s: (s32[], bf16[{M},{K}], bf16[{K},{N}], bf16[128,{N}], f32[1000,{K}])) -> pred[] {{
  %s = (s32[], bf16[{M},{K}]{{1,0}}, bf16[{K},{N}]{{1,0}}, bf16[128,{N}]{{1,0}}, f32[1000,{K}]{{1,0}}) parameter(0)
  %i = s32[] get-tuple-element(%s), index=0
  %k = s32[] constant(4)
  ROOT %lt = pred[] compare(%i, %k), direction=LT
}}

ENTRY %main (s: (s32[], bf16[{M},{K}], bf16[{K},{N}], bf16[128,{N}], f32[1000,{K}])) -> (s32[], bf16[{M},{K}], bf16[{K},{N}], bf16[128,{N}], f32[1000,{K}]) {{
  %s = (s32[], bf16[{M},{K}]{{1,0}}, bf16[{K},{N}]{{1,0}}, bf16[128,{N}]{{1,0}}, f32[1000,{K}]{{1,0}}) parameter(0)
  ROOT %loop = (s32[], bf16[{M},{K}]{{1,0}}, bf16[{K},{N}]{{1,0}}, bf16[128,{N}]{{1,0}}, f32[1000,{K}]{{1,0}}) while(%s), condition=%cond, body=%body
}}
"""

DEVICE = cost.Device("test", "gpu", hbm_gbps=1000.0, peak_tflops=100.0, cores=1, source="test")
CONSTANTS = cost.Constants(launch_us=3.0, round_trip_us=20.0)


def test_each_kernel_moves_its_shapes_bytes_and_does_its_dots_flops():
  kernels, loops = cost.kernel_costs(PROGRAM)
  by_name = {k.name: k for k in kernels}
  assert by_name["g"].bytes == 2 * (M * K + K * N + M * N) and by_name["g"].flops == 2 * M * K * N
  assert by_name["t"].bytes == 2 * 2 * M * N and by_name["t"].flops == 0
  assert by_name["u"].bytes == 2 * (M * N + N)  # a top-level slice reads its operand
  assert by_name["w"].bytes == 2 * (2 * N + 4)  # in place: the update (and the index) in, out
  assert by_name["r"].bytes == 4 * K + 4 + 4 * K  # one row of the table, the index, the row
  assert by_name["v2"].runs == 3 and by_name["lt"].runs in (1, 4)
  assert loops == [3]


def test_the_iteration_time_is_the_sum_of_the_kernels_max_plus_launches_and_round_trips():
  kernels, _ = cost.kernel_costs(PROGRAM)
  est = cost.estimate(PROGRAM, "test", constants=CONSTANTS, dev=DEVICE)
  gemm_s = max(2 * (M * K + K * N + M * N) / 1e12, 2 * M * K * N / 1e14)
  assert gemm_s == 2 * M * K * N / 1e14  # FLOP-bound at these sizes
  memory_s = (2 * 2 * M * N + 2 * (M * N + N) + 2 * (2 * N + 4) + (8 * K + 4)
              + 3 * 2 * 2 * N) / 1e12  # tanh, slice, write, row, 3 small tanh trips
  memory_s += sum(k.bytes * k.runs for k in kernels if k.opcode == "compare") / 1e12
  # The body's five kernels, the inner loop's body 3 times and its condition 4, the outer
  # loop's condition once.
  launches = 5 + 3 + 4 + 1
  assert len(kernels) == 8
  assert est.launches == launches
  assert est.round_trips == 1 + 3  # the outer iteration and the nested loop's trips
  expected_ms = (gemm_s + memory_s) * 1e3 + launches * 3e-3 + 4 * 20e-3
  assert est.ms == pytest.approx(expected_ms, rel=1e-9)
  assert est.roofline_ms == pytest.approx((gemm_s + memory_s) * 1e3, rel=1e-9)
  assert est.flops == 2 * M * K * N


def test_a_tpu_makes_no_round_trips():
  tpu = cost.Device("t", "tpu", 1000.0, 100.0, 1, "test")
  assert cost.estimate(PROGRAM, "t", constants=CONSTANTS, dev=tpu).round_trips == 0


def test_a_tpu_s_launch_is_xla_s_estimate_of_its_near_empty_fusions():
  """On a TPU the launch cost is the median of XLA:TPU's estimated cycles over the fusions that
  move under 64 KB, over the clock: here the two small tanh fusions (1000 and 3000 cycles at
  1 GHz: 2 µs); the GEMM's estimate (it moves 88 MB) is not among them."""
  cycles = lambda n: f', backend_config={{"window_config":{{"estimated_cycles":"{n}"}}}}'
  text = PROGRAM.replace("calls=%tanh_small", "calls=%tanh_small" + cycles(1000))
  text = text.replace("calls=%row_computation", "calls=%row_computation" + cycles(3000))
  text = text.replace("calls=%gemm_computation", "calls=%gemm_computation" + cycles(10 ** 8))
  tpu = cost.Device("t", "tpu", 1000.0, 100.0, 1, "test", clock_ghz=1.0)
  kernels, _ = cost.kernel_costs(text)
  assert {k.name: k.cycles for k in kernels if k.cycles} == {"v2": 1000, "r": 3000, "g": 10 ** 8}
  assert cost.tpu_launch_us(kernels, tpu) == pytest.approx(2.0)
  est = cost.estimate(text, "t", constants=CONSTANTS, dev=tpu)
  launches = sum(k.runs for k in kernels if not k.scalar)
  assert est.launches == launches and est.launch_us == pytest.approx(2.0)
  assert est.ms == pytest.approx(est.roofline_ms + launches * 2e-3, rel=1e-9)
  assert est.round_trips == 0
  # Without estimates (or a clock), the fitted launch.
  assert cost.estimate(PROGRAM, "t", constants=CONSTANTS, dev=tpu).launch_us == 3.0


def test_the_prediction_is_thm_3_8_at_the_steps_ratio():
  p = cost.prediction(10.0, 0.5, alpha=0.75, gamma=7)
  assert p["c"] == 0.05
  assert p["speedup"] == pytest.approx(float(analysis.walltime_improvement(0.75, 7, 0.05)), abs=1e-3)
  assert p["speedup"] == pytest.approx((1 - 0.75 ** 8) / (0.25 * (7 * 0.05 + 1)), abs=1e-3)
  assert p["round_ms"] == 7 * 0.5 + 10.0 and set(p["speedup_by_gamma"]) == set(range(1, 9))


def test_the_launch_fit_recovers_the_constant_of_exact_points():
  points = [(0.1, 400, 1, 0.1 + 400 * 2.5e-3 + 17.5e-3), (0.02, 150, 1, 0.02 + 150 * 2.5e-3
                                                                     + 17.5e-3)]
  assert cost.fit_launch_us(points, round_trip_us=17.5) == pytest.approx(2.5)
  # Two points that disagree: the fit lies between their own constants.
  points[1] = (0.02, 150, 1, 0.02 + 150 * 1.5e-3 + 17.5e-3)
  assert 1.5 < cost.fit_launch_us(points, round_trip_us=17.5) < 2.5


def _abstract_params(gin_file, **changes):
  """A model's parameters from its gin file (with `changes`), bfloat16, shapes only."""
  import dataclasses  # pylint: disable=import-outside-toplevel
  from specjax.aot import report  # pylint: disable=import-outside-toplevel
  from specjax.app.gin_config import model_config_from_file  # pylint: disable=import-outside-toplevel
  from specjax.models import build_model  # pylint: disable=import-outside-toplevel
  model = build_model(dataclasses.replace(model_config_from_file(gin_file), **changes))
  return report.abstract_params(model, "bfloat16")


def _nbytes(tree):
  import jax  # pylint: disable=import-outside-toplevel
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def test_the_floor_leaves_out_the_weights_a_step_does_not_read():
  """A T5 1.1 step reads neither the encoder, nor the cross-attention key and value kernels
  (applied once, in `encode`), nor the untied input embedding (a few gathered rows); the
  logits' embedding of a tied model it reads whole. Counted against the tree by hand."""
  from specjax.aot.report import read_weights  # pylint: disable=import-outside-toplevel
  params = _abstract_params("models/t5_1_1_tiny.gin")
  decoder = params["decoder"]
  unread = _nbytes(params["encoder"]) + _nbytes(params["token_embedder"]) + sum(
      _nbytes(decoder[name]["encoder_decoder_attention"][kv])
      for name in decoder if name.startswith("layers_") for kv in ("key", "value"))
  assert unread > 0
  assert _nbytes(read_weights(params)) == _nbytes(params) - unread
  # Two models side by side (a loop's target and drafter) are each read as alone.
  both = _nbytes(read_weights({"target": params, "drafter": params}))
  assert both == 2 * _nbytes(read_weights(params))

  tied = _abstract_params("models/decoder_only_tiny.gin", logits_via_embedding=True)
  assert "logits_dense" not in tied["decoder"]
  assert _nbytes(read_weights(tied)) == _nbytes(tied)
  untied = _abstract_params("models/decoder_only_tiny.gin", logits_via_embedding=False)
  assert _nbytes(read_weights(untied)) == _nbytes(untied) - _nbytes(
      untied["decoder"]["token_embedder"])
