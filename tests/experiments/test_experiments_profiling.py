"""The profiling and benchmark experiments (a round's parts in a batch and a stream, the two samplers,
token trees, the feature head beside the draft) in fast mode on the bundled LM pair: they run
and print or write their tables."""
import math

import pytest

from experiments.bench import eagle as bench_eagle, trees as bench_trees
from tests.experiments.test_experiments import _files


def _markdown_tables(text):
  """Every markdown table in text, as a list of {header: cell} rows."""
  tables, header = [], None
  for line in text.splitlines():
    if not line.startswith("|"):
      header = None
      continue
    cells = [c.strip() for c in line.strip("|").split("|")]
    if header is None:
      header = cells
      tables.append([])
    elif not line.startswith("|---"):
      tables[-1].append(dict(zip(header, cells)))
  return tables


@pytest.mark.parametrize("pair,stream", [("lm", 0), ("translate", 0), ("lm", 3)])
def test_profile_round_accounts_for_a_round(capsys, tmp_path, pair, stream):
  """Decoder-only and encoder-decoder in one padded batch; the LM pair's 3 inputs streamed
  through 2 slots."""
  from experiments.bench import profile_round  # pylint: disable=import-outside-toplevel
  profile_round.main(["--pair", pair, "--cache_lens", "256", "--gammas", "2", "--batches", "2",
                      "--new_tokens", "12", "--repeats", "1", "--stream", str(stream),
                      "--output_dir", str(tmp_path)])
  out = capsys.readouterr().out
  steps, rounds = _markdown_tables(out)
  assert len(steps) == len(rounds) == 1
  step, row = steps[0], rounds[0]
  assert (step["L"], step["B"], row["L"], row["B"], row["γ"]) == ("256", "2", "256", "2", "2")
  for name in ("target 1-token call ms", "draft 1-token call ms", "AR call / steps ms",
               "floor ms"):
    assert float(step[name]) > 0, name
  for name in ("target γ+1 call ms", "draft proposal ms", "verification ms", "call / rounds ms",
               "r", "c", "E[tokens]", "predicted speedup", "measured speedup",
               "calls apart ms", "calls together ms", "free-draft bound",
               "extra tokens GFLOP/s"):
    assert float(row[name]) > 0, name
  # Together: the target's 3-token call and two draft steps in one loop, apart: the same
  # calls each in its own loop; the difference is timing (either sign on a quiet cache).
  assert math.isclose(float(row["calls apart ms"]),
                      float(row["target γ+1 call ms"]) + 2 * float(step["draft 1-token call ms"]),
                      rel_tol=0.02, abs_tol=0.002)
  assert math.isfinite(float(row["together - apart ms"]))
  assert math.isfinite(float(row["c in a round"]))
  # Slopes between two budgets (12 and 6 tokens, one repeat): timing noise can give them
  # either sign here, so only that they are numbers is asserted.
  for table, name in ((step, "AR step ms"), (step, "AR call fixed ms"), (row, "round ms"),
                      (row, "call fixed ms"), (row, "unaccounted %"), (row, "speedup at parts")):
    assert math.isfinite(float(table[name])), name
  assert 0 <= float(row["α"]) <= 1 and 1 <= float(row["E[tokens]"]) <= 3
  # A slot's round emits 1 .. γ+1 tokens; idle slots at the stream's tail only lower the mean.
  assert 0 < float(row["tokens / round"]) <= 3
  if stream:  # 3 × 12 tokens through 2 slots: at least ceil(12 / 3) + ceil(12 / 3) rounds
    assert 8 <= int(row["rounds"]) <= 24
  else:  # 12 tokens at γ = 2 take between ceil(12 / 3) = 4 rounds (all accepted) and 12 (none)
    assert 4 <= int(row["rounds"]) <= 12
    assert math.isclose(float(row["tokens / round"]), 12 / int(row["rounds"]), rel_tol=0.01)
  assert "| B | γ |" in (tmp_path / "profile_round.md").read_text()
  with pytest.raises(ValueError, match="stream must be an integer >= 0"):
    profile_round.main(["--stream", "-1"])


def test_bench_sampler_sets_the_two_samplers_side_by_side(tmp_path, capsys):
  from experiments.bench import sampler as bench_sampler  # pylint: disable=import-outside-toplevel
  from specjax import sampling  # pylint: disable=import-outside-toplevel
  from specjax.verify import step  # pylint: disable=import-outside-toplevel
  with bench_sampler.drawing_with(sampling.race):
    assert step.categorical is sampling.race and sampling.categorical is sampling.race
  assert step.categorical is bench_sampler.SAMPLERS["two-stage"]
  bench_sampler.main(["--batches", "1", "--vocabs", "300", "--examples", "1", "--new_tokens",
                      "6", "--gamma", "2", "--repeats", "1", "--weights_dtype", "float32",
                      "--output_dir", str(tmp_path)])
  micro, e2e = _markdown_tables(capsys.readouterr().out)
  assert [(r["V"], r["B"]) for r in micro] == [("300", "1")]
  assert float(micro[0]["one race µs"]) > 0 and float(micro[0]["two-stage µs"]) > 0
  # main() raises if the two variants drew the same tokens (the patch not taking effect).
  assert [r["sampler"] for r in e2e] == ["two-stage", "one race"]
  for row in e2e:
    assert float(row["AR ms/token"]) > 0 and float(row["spec γ=2 ms/token"]) > 0
    assert 0 <= float(row["α"]) <= 1
  assert "one race" in (tmp_path / "bench_sampler.md").read_text()


def test_bench_dots_times_each_dtype_on_each_shape(tmp_path, capsys):
  from experiments.bench import dots as bench_dots  # pylint: disable=import-outside-toplevel
  from specjax import machine  # pylint: disable=import-outside-toplevel
  rows = bench_dots.main(["--rows", "1", "6", "--dots", "2", "--passes", "1",
                          "--output_dir", str(tmp_path)])
  assert [(r["weights"], r["rows"]) for r in rows] == [
      (name, m) for name in bench_dots.SHAPES for m in (1, 6)]
  for row in rows:
    assert all(row[f"{d}_us"] > 0 for d in bench_dots.DTYPES)
    assert row["fastest"] == min(bench_dots.DTYPES, key=lambda d: row[f"{d}_us"])
  assert machine.describe() in (tmp_path / "bench_dots.md").read_text()
  assert "| weights | rows |" in capsys.readouterr().out
  with pytest.raises(ValueError, match="rows must be an integer >= 1"):
    bench_dots.main(["--rows", "0"])


def test_bench_trees_lm(tmp_path):
  # Untimed (the timed passes would double this test's time; docs/results/bench_trees_lm is
  # the timed run).
  rows = bench_trees.main(["--fast", "--pair", "lm", "--no_timing", "--output_dir",
                           str(tmp_path)])
  _files(tmp_path, "bench_trees", png=False)
  assert [r["kind"] for r in rows] == ["chain", "static", "dynamic"]
  for r in rows:
    assert r["tokens_per_call"] >= 1 and r["r"] > 0 and r["c"] > 0 and "ms_per_token" not in r
    assert 0 <= r["none_accepted"] <= 1 and 0 <= r["all_accepted"] <= 1
    assert r["predicted_speedup"] == pytest.approx(
        r["tokens_per_call"] / (r["r"] + r["c"] * r["draft_calls_per_round"]))
  assert "Best tree vs best chain" in (tmp_path / "bench_trees.md").read_text()


def test_bench_eagle_sets_the_bundled_head_beside_the_draft(tmp_path):
  # One prompt, 8 tokens, each kind of decoder once (docs/results/bench_eagle* are the timed
  # runs); the run itself fails on a greedy output that differs beyond a near-tie.
  rows = bench_eagle.main(["--fast", "--pair", "lm", "--weights_dtype", "bfloat16",
                           "--output_dir", str(tmp_path)])
  _files(tmp_path, "bench_eagle", png=False)
  names = [r["decoder"] for r in rows]
  assert names[0] == "autoregressive" and len(names) == 6
  assert any("spines (2, 1)" in n for n in names) and any("dynamic" in n for n in names)
  for r in rows[1:]:
    assert 0 <= r["alpha"] <= 1 and r["tokens_per_call"] >= 1 and r["speedup"] > 0
    assert r["greedy"].startswith("1 of 1 identical"), r["greedy"]
  # The trained head, not a random one (whose α is about 0), out-guesses the 1.4M draft here.
  heads = [r["alpha"] for r in rows if r["decoder"].startswith("feature head")]
  drafts = [r["alpha"] for r in rows if r["decoder"].startswith("draft model")]
  assert min(heads) > 0.7 > max(drafts)


def test_bench_verify_sets_each_verifier_beside_the_target_on_a_pair(tmp_path):
  """bench.verify --pair: time, acceptance and quality per verifier on the same inputs; at
  T = 0 the exact verifiers emit the target's own tokens, so their perplexity is its."""
  from experiments.bench import verify as bench_verify  # pylint: disable=import-outside-toplevel
  rows = bench_verify.main(["--fast", "--pair", "lm", "--output_dir", str(tmp_path)])
  _files(tmp_path, "bench_verify_pairs", png=False)
  for temperature in (1.0, 0.0):
    cell = {r["decoder"]: r for r in rows if r["temperature"] == temperature}
    assert list(cell) == [bench_verify.AR, "reference (exact)", "fused (exact)",
                          "sigmoid α=−β=10000 (NOT EXACT)"]
    assert [r["exact"] for r in cell.values()] == [True, True, True, False]
    assert cell[bench_verify.AR]["accept_rate"] == "" and cell[bench_verify.AR]["speedup"] == 1
    for row in cell.values():
      assert row["ms_per_token"] > 0 and row["target_ppl"] > 1
    # α = −β = 10⁴ maps every logit to σ(≈ 0.5): the guesses' ratio is about 1.
    assert cell["sigmoid α=−β=10000 (NOT EXACT)"]["accept_rate"] > 0.9
  greedy = [r["target_ppl"] for r in rows if r["temperature"] == 0.0 and r["exact"]]
  assert max(greedy) == pytest.approx(min(greedy), rel=1e-5)


def test_sigmoid_quality_writes_its_three_parts(tmp_path):
  from experiments.bench import sigmoid_quality  # pylint: disable=import-outside-toplevel
  parts = sigmoid_quality.main(["--fast", "--output_dir", str(tmp_path)])
  _files(tmp_path, "sigmoid_quality", png=False)
  assert [len(parts[p]) for p in ("analytic", "first_token", "tables")] == [4, 5, 5]
  exact, paper = parts["first_token"][0], parts["first_token"][1]  # fused; sigmoid α = −β = 10⁴
  assert exact["verifier"] == "fused (exact)" and paper["verifier"].startswith("sigmoid α=−β=10000")
  # The exact law is the target's (TV 0 up to float error); the paper's sigmoid accepts ~all.
  assert exact["tv"] < 1e-4 < paper["tv"] and paper["accept"] > 0.99


def test_bench_eagle_heads_sets_head_kinds_side_by_side(tmp_path):
  """--heads: the bundled EAGLE-1 head beside an EAGLE-3 head whose fusion selects the final
  hidden state (the bundled head warm-started, `specjax.train.rollout`): in float32 both
  draft the same guesses, so every count of the table is equal between them."""
  import dataclasses  # pylint: disable=import-outside-toplevel
  import shutil  # pylint: disable=import-outside-toplevel

  import jax  # pylint: disable=import-outside-toplevel

  from specjax import checkpoints  # pylint: disable=import-outside-toplevel
  from specjax.app import bundled  # pylint: disable=import-outside-toplevel
  from specjax.models import FeatureHead, model_gin_text  # pylint: disable=import-outside-toplevel
  from specjax.train.rollout import warm_start_params  # pylint: disable=import-outside-toplevel
  head, params = bundled.load("lm", "eagle")
  fused = FeatureHead(dataclasses.replace(head.config, feature_layers=(1, 2, 6)))
  folder = tmp_path / "eagle3"
  checkpoints.save_t5x(jax.device_get(warm_start_params(fused, fused.init(0), params, 6)),
                       str(folder), step=0)
  (folder / "model.gin").write_text(model_gin_text(fused.config))
  shutil.copy(bundled.model_dir("lm", "eagle") / "token_ranking.npy", folder)
  rows = bench_eagle.main(["--fast", "--pair", "lm", "--weights_dtype", "bfloat16",
                           "--heads", f"EAGLE-1=bundled:lm/eagle,EAGLE-3={folder}",
                           "--output_dir", str(tmp_path / "out")])
  _files(tmp_path / "out", "bench_eagle_heads", png=False)
  assert [(r["head"], r["decoder"]) for r in rows] == [
      ("EAGLE-1", "chain γ=2"), ("EAGLE-1", "dynamic b2 e1 d2"),
      ("EAGLE-3", "chain γ=2"), ("EAGLE-3", "dynamic b2 e1 d2")]
  for one, three in zip(rows[:2], rows[2:]):
    for column in ("alpha", "tokens_per_call", "accepted_per_round", "acceptance_by_position"):
      assert one[column] == three[column], column
  for row in rows:
    assert row["alpha"] > 0.5 and row["tokens_per_call"] > 1 and row["speedup"] > 0
    assert len(row["acceptance_by_position"].split()) == 2
    assert row["greedy"].startswith("1 of 1 identical"), row["greedy"]


def test_bench_eagle_heads_acceptance_by_position_and_bad_heads():
  from experiments.common import eagle_heads  # pylint: disable=import-outside-toplevel
  mean, rates = eagle_heads.acceptance([2, 1, 1])  # rounds accepting 0, 1, 2 guesses
  assert mean == 0.75 and rates == [0.5, 0.5]
  from specjax.train.head_eval import parse_heads  # pylint: disable=import-outside-toplevel
  assert parse_heads("A=x, B = y") == [("A", "x"), ("B", "y")]
  for bad in ("A", "A=x,=y", "A=x,A=y"):
    with pytest.raises(ValueError, match="--heads"):
      parse_heads(bad)
  assert eagle_heads.table_settings("5,7", "none", 64, 1) == dict(
      gammas=(5, 7), dynamic_tree=None, num_examples=64, repeats=1)
  assert eagle_heads.table_settings(tree="3,2,6") == dict(dynamic_tree=(3, 2, 6))
  for bad, match in ((dict(gammas="0"), "every γ"), (dict(gammas="a"), "--gammas"),
                     (dict(tree="2,1"), "--tree"), (dict(examples=0), "--examples")):
    with pytest.raises(ValueError, match=match):
      eagle_heads.table_settings(**bad)


@pytest.mark.parametrize("flag", [False, True])
def test_bench_eagle_heads_stops_at_eos_when_asked(flag, monkeypatch, tmp_path):
  """--stop_at_eos: the decodes the table compares end at the vocabulary's EOS; without it
  they run on to the budget (eos_id -1)."""
  from experiments.common import eagle_heads  # pylint: disable=import-outside-toplevel
  from specjax.data import load_vocab  # pylint: disable=import-outside-toplevel
  seen = []

  class Stop(Exception):
    pass

  def decoders(pair, max_new_tokens, config):
    seen.append(config.eos_id)
    raise Stop

  monkeypatch.setattr(eagle_heads, "Decoders", decoders)
  with pytest.raises(Stop):
    bench_eagle.main(["--fast", "--pair", "lm", "--heads", "EAGLE-1=bundled:lm/eagle",
                      "--output_dir", str(tmp_path)] + (["--stop_at_eos"] if flag else []))
  assert seen == [load_vocab().eos_id if flag else -1]
  assert load_vocab().eos_id >= 0
