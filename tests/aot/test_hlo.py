"""The optimized-HLO reader (`specjax.aot.hlo`) on hand-written programs: which kernels an
iteration launches, which layer each belongs to, and which write a weight-shaped float32 array."""
import pytest

from specjax.aot import hlo, targets

PROGRAM = """HloModule jit_steps

%fused_a (p: bf16[4,8]) -> f32[4,8] {
  %p = bf16[4,8]{1,0} parameter(0)
  ROOT %c = f32[4,8]{1,0} convert(%p)
}

%body (state: (s32[], f32[2,8])) -> (s32[], f32[2,8]) {
  %state = (s32[], f32[2,8]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%state), index=0
  %x = f32[2,8]{1,0} get-tuple-element(%state), index=1
  %w = f32[4,8]{1,0} fusion(%x), kind=kLoop, calls=%fused_a, metadata={op_name="jit(f)/decoder/layers_0/mlp/wo/dot_general"}
  %g = f32[2,8]{1,0} fusion(%w), kind=kCustom, calls=%fused_a, backend_config={"fusion_backend_config":{"kind":"__triton_nested_gemm_fusion"}}, metadata={op_name="jit(f)/decoder/layers_0/mlp/wi/dot_general"}
  %h = f32[2,8]{1,0} fusion(%g), kind=kLoop, calls=%fused_a, metadata={op_name="jit(f)/decoder/layers_1/mlp/wi/dot_general"}
  %s = bf16[8]{0} custom-call(%h), custom_call_target="__cudnn$fmha", metadata={op_name="jit(f)/decoder/layers_1/attention"}
  %cs = f32[4,8]{1,0} copy-start(%w)
  %one = s32[] constant(1)
  %n = s32[] add(%i, %one)
  ROOT %t = (s32[], f32[2,8]{1,0}) tuple(%n, %h)
}

%cond (state: (s32[], f32[2,8])) -> pred[] {
  %state = (s32[], f32[2,8]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%state), index=0
  %k = s32[] constant(4)
  ROOT %lt = pred[] compare(%i, %k), direction=LT
}

ENTRY %main (x: f32[2,8]) -> f32[2,8] {
  %x = f32[2,8]{1,0} parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], f32[2,8]{1,0}) tuple(%zero, %x)
  %loop = (s32[], f32[2,8]{1,0}) while(%init), condition=%cond, body=%body
  ROOT %out = f32[2,8]{1,0} get-tuple-element(%loop), index=1
}
"""


def test_body_kernels_are_one_iteration_of_the_outer_loop():
  kernels = hlo.body_kernels(PROGRAM)
  # The body's three fusions, its custom call and the add; the condition's compare. Names and
  # views of buffers (parameters, tuples, constants) and the TPU-style prefetch are not kernels.
  assert [k.opcode for k in kernels] == ["fusion", "fusion", "fusion", "custom-call", "add",
                                         "compare"]
  assert kernels[1].kind == "kCustom/__triton_nested_gemm_fusion"
  assert kernels[3].kind == "__cudnn$fmha"
  assert kernels[0].outputs() == [("f32", 32)]


def test_per_layer_reads_the_layer_from_the_op_name():
  per_layer, layers, outside = hlo.per_layer(hlo.body_kernels(PROGRAM))
  assert (per_layer, layers, outside) == (2.0, 2, 2)  # layers_0: 2 kernels, layers_1: 2


def test_weight_shaped_float32_temporaries_are_found_in_either_orientation():
  kernels = hlo.body_kernels(PROGRAM)
  assert [k.source for k in hlo.f32_temporaries(kernels, [(4, 8)])] == [
      "jit(f)/decoder/layers_0/mlp/wo/dot_general"]
  assert len(hlo.f32_temporaries(kernels, [(8, 4)])) == 1  # [in, out] or [out, in]
  assert hlo.f32_temporaries(kernels, [(2, 8), (1, 8)]) != []  # the products' own shape
  assert hlo.f32_temporaries(kernels, [(16, 16), (8,)]) == []  # vectors are no matrices


def test_a_module_without_a_loop_has_no_iteration():
  assert hlo.body_kernels(PROGRAM.split("%body")[0] + "ENTRY %main (x: f32[2]) -> f32[2] {\n"
                          "  ROOT %x = f32[2]{0} parameter(0)\n}\n") == []


@pytest.mark.parametrize("name", ["x100", "", "tpu-v99", 7])
def test_an_unknown_accelerator_is_one_line_naming_the_known_ones(name):
  with pytest.raises(targets.TargetUnavailable) as info:
    targets.target(name)
  message = str(info.value)
  assert "\n" not in message and "h200" in message and "tpu-v5e" in message


def test_a_gpu_described_by_a_file_must_be_a_target_config(tmp_path):
  path = tmp_path / "mine.txtpb"
  path.write_text("platform_name: 'CUDA'\n")
  with pytest.raises(targets.TargetUnavailable, match="not a GpuTargetConfigProto"):
    targets.gpu_config_text(str(path))
  with pytest.raises(targets.TargetUnavailable, match="missing.txtpb"):
    targets.gpu_config_text(str(tmp_path / "missing.txtpb"))


def test_fields_an_older_proto_lacks_are_dropped_with_their_blocks():
  text = ('# a comment\nname: "x { y"\nnew_field: 3\ninfo {\n  a: 1\n  newer { b: 2 }\n'
          '  newest {\n    c: "}"\n    d { e: 1 }\n  }\n  f: 4\n}\nlast { g: 1 }\n')
  kept = targets.known_fields_only(text, {"name", "info", "a", "f", "last", "g"})
  assert kept == 'name: "x { y"\ninfo {\n  a: 1\n  f: 4\n}\nlast { g: 1 }\n'
