"""experiments.bench.scale at tiny sizes (a smoke run in a fresh process, with the HLO counts),
and the HLO counter on loops whose counts are known."""
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.bench import scale as bench_scale
from specjax.aot import hlo as hlo_stats
from specjax.analysis import expected_tokens

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
  """One tiny run: both families, both attention paths of specjax, float32, XLA dumps on."""
  out = tmp_path_factory.mktemp("bench_scale")
  env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
  cmd = [sys.executable, "-m", "experiments.bench.scale", "--sizes", "tiny", "--families",
         "decoder_only", "t5", "--batches", "1", "--new_tokens", "4", "--repeats", "1",
         "--dtype", "float32", "--attention", "specjax", "--copy_mb", "4", "--hlo",
         "--output_dir", str(out)]
  result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  assert (out / "bench_scale.md").read_text().startswith("# bench_scale")
  return json.loads((out / "bench_scale.json").read_text())


def test_smoke_rows_are_complete_and_greedy_equal(smoke):
  rows = smoke["rows"]
  assert [(r["family"], r["size"], r["batch"], r["attention"]) for r in rows] == [
      ("decoder_only", "tiny", 1, "specjax"), ("t5", "tiny", 1, "specjax")]
  assert smoke["copy_gbps"] > 0 and smoke["platform"] == jax.devices()[0].platform
  for row in rows:
    # speculative decoding with either draft, and the plain fori_loop peer, give the
    # target's own greedy tokens (float32)
    assert row["greedy_equal_tied"] and row["greedy_equal_untied"]
    assert row["greedy_equal_feature"] and row["feature_round_ms"] > 0
    for name in ("target_step_ms", "draft_step_ms", "round_ms", "step_floor_ms"):
      assert np.isfinite(row[name]) and row[name] > 0, name
    assert row["c"] == pytest.approx(row["draft_step_ms"] / row["target_step_ms"])
    assert row["roofline_fraction"] == pytest.approx(row["step_floor_ms"] / row["target_step_ms"])
    assert 1 <= row["tokens_per_call_untied"] <= row["gamma"] + 1
    for alpha in bench_scale.ALPHAS:  # Eq. 1's tokens per round over the measured round cost
      want = float(expected_tokens(alpha, row["gamma"])) * row["target_step_ms"] / row["round_ms"]
      assert row[f"predicted_speedup_{alpha}"] == pytest.approx(want)
    assert set(row["compile_s"]) >= {"target", "draft", "spec_tied", "spec_untied",
                                     "spec_feature"}
  assert rows[0]["greedy_equal_reference"] and rows[0]["reference_step_ms"] > 0
  assert "reference_step_ms" not in rows[1]  # the peer is decoder-only


def test_smoke_hlo_has_no_host_transfer_inside_a_round(smoke):
  for label, hlo in smoke["hlo"].items():
    loops = hlo["loops"]
    runs = {name: stats for name, stats in loops.items() if name.startswith("jit_run_loop.")}
    # the autoregressive loop and the speculative loops: compiles of the one runner
    assert len(runs) >= 2, (label, sorted(loops))
    for name, stats in loops.items():
      assert stats["whiles"] >= 1 and stats["body_kernels"] > 0, (label, name)
      assert stats["body_host_transfers"] == 0, (label, name, stats)
    # a speculative round holds the draft's loop (one nested while at least); the
    # autoregressive step holds none
    nested = sorted(stats["body_whiles"] for stats in runs.values())
    assert nested[0] == 0 and nested[-1] >= 1, (label, nested)
    assert set(hlo["decode_step"]) == {"specjax"}
  assert any(name.startswith("jit_reference_decode.")
             for name in smoke["hlo"]["decoder_only/tiny/B1"]["loops"])


def _with_callback(x):
  def body(carry):
    i, y = carry
    jax.debug.callback(lambda v: None, i)  # a host round trip in every iteration
    return i + 1, y * 2.0
  return jax.lax.while_loop(lambda c: c[0] < 3, body, (0, x))[1]


def _plain(x):
  return jax.lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * 2.0), (0, x))[1]


def test_hlo_counter_sees_a_host_callback_inside_a_loop():
  x = jnp.ones((4,))
  with_cb = hlo_stats.loop_stats(jax.jit(_with_callback).lower(x).compile().as_text())
  plain = hlo_stats.loop_stats(jax.jit(_plain).lower(x).compile().as_text())
  assert with_cb["whiles"] == plain["whiles"] == 1
  assert with_cb["body_host_transfers"] >= 1 and plain["body_host_transfers"] == 0
  assert sum(with_cb["body_custom_calls"].values()) >= 1
  # StableHLO (a callback lowers for this machine's platform only)
  lowered = hlo_stats.stablehlo_stats(jax.jit(_with_callback).lower(x).as_text())
  assert lowered["whiles"] == 1 and lowered["host_transfers"] >= 1
  assert hlo_stats.stablehlo_stats(jax.jit(_plain).lower(x).as_text())["host_transfers"] == 0


def test_xla_flags_after_the_backend_started_are_refused():
  jnp.zeros(1).block_until_ready()
  with pytest.raises(ValueError, match="before JAX starts its backend"):
    bench_scale.set_xla_flags(bench_scale.XLA_PRESETS["while_command_buffer"])
  bench_scale.set_xla_flags("")  # nothing to set: no error


def test_bad_arguments_are_named():
  with pytest.raises(SystemExit):
    bench_scale.parse_args(["--attention", "flash"])
  with pytest.raises(ValueError, match="new_tokens"):
    bench_scale.parse_args(["--new_tokens", "0"])
  fast = bench_scale.parse_args(["--fast", "--batches", "2"])
  assert (fast.sizes, fast.batches, fast.dtype) == (["tiny"], [2], "float32")  # given wins
