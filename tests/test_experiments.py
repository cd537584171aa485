"""The experiment modules in fast mode on the bundled pairs: they run and write their files."""
import csv
import json
import math

import pytest

from experiments import bench, bench_trees, common, figure1, table1, table2_speedup, \
    table3_alpha, table5_lenience
from tests.test_analysis import TABLE1


def _files(folder, name, png=True):
  for ext in ("md", "csv", "json") + (("png",) if png else ()):
    path = folder / (f"{name}.{ext}" if ext != "png" else f"{name}.png")
    assert path.exists() and path.stat().st_size > 0, path


def test_table1_reproduces_paper(tmp_path):
  rows = table1.main(["--output_dir", str(tmp_path)])
  md = (tmp_path / "table1.md").read_text()
  for alpha, gamma, ops, speed in TABLE1:
    assert f"| {alpha:g} | {gamma} | {ops:.3g} | {speed:.3g} |" in md
  assert [(r["operations"], r["speed"]) for r in rows] == [(o, s) for _, _, o, s in TABLE1]
  for fig in ("figure2.png", "figure3.png", "figure4.png"):
    assert (tmp_path / fig).read_bytes()[:4] == b"\x89PNG"
  with open(tmp_path / "table1.csv") as f:
    assert len(list(csv.DictReader(f))) == len(TABLE1)


def test_table3_alpha_gin_pair(tmp_path):
  rows = table3_alpha.main(["--fast", "--gin_file=experiments/pair.gin",
                            "--output_dir", str(tmp_path)])
  _files(tmp_path, "table3_alpha")
  assert {r["draft"] for r in rows} == {"bigram", "model"}
  assert all(0.0 <= r["alpha"] <= 1.0 and r["positions"] > 0 for r in rows)
  assert common.RANDOM_NOTE in (tmp_path / "table3_alpha.md").read_text()
  assert json.loads((tmp_path / "table3_alpha.json").read_text())["rows"] == rows


def test_table2_speedup_lm(tmp_path):
  rows = table2_speedup.main(["--fast", "--pair", "lm", "--output_dir", str(tmp_path)])
  _files(tmp_path, "table2_speedup")
  assert [r["gamma"] for r in rows] == [1, 3]
  for r in rows:
    assert r["c"] > 0 and r["r"] > 0 and r["EMP"] > 0
    assert r["EXP_CPU"] == pytest.approx((1 - r["alpha"] ** (r["gamma"] + 1)) /
                                         max(1 - r["alpha"], 1e-12) / (r["gamma"] * r["c"] + r["r"]),
                                         rel=1e-6) or r["alpha"] == 1.0
  assert "EXP_CPU" in (tmp_path / "table2_speedup.md").read_text()


def test_table5_lenience_translate(tmp_path):
  rows = table5_lenience.main(["--fast", "--pair", "translate", "--output_dir", str(tmp_path)])
  _files(tmp_path, "table5_lenience")
  lenient = [r for r in rows if r["lenience"] != "AR"]
  assert [(r["temperature"], r["lenience"]) for r in lenient] == [(1.0, 1.0), (1.0, 0.3),
                                                                  (0.0, 0.5)]
  assert all(r["perplexity"] > 1 and 0 <= r["bleu"] <= 100 for r in rows)


def test_figure1_trace_covers_output(tmp_path):
  record = figure1.main(["--fast", "--output_dir", str(tmp_path)])
  assert len(record["rounds"]) == record["target_calls"]
  emitted = sum(len(r["accepted"]) + (r["correction"] is not None) for r in record["rounds"])
  assert 1 <= emitted <= 8
  html = (tmp_path / "figure1.html").read_text()
  assert "<html" in html.lower()
  assert (tmp_path / "figure1.txt").read_text().count("\n") == len(record["rounds"])
  for ext in ("md", "json"):
    assert (tmp_path / f"figure1.{ext}").stat().st_size > 0


def test_bench_with_hf_peer(tmp_path):
  rows = bench.main(["--fast", "--pair", "translate", "--output_dir", str(tmp_path)])
  _files(tmp_path, "bench", png=False)
  names = [r["decoder"] for r in rows]
  assert names[:2] == ["specjax autoregressive", "specjax speculative γ=2"]
  assert "HF greedy" in names and "HF assisted γ=2" in names
  hf_greedy = rows[names.index("HF greedy")]
  assert hf_greedy["same_as_specjax"] == "1/1"
  md = (tmp_path / "bench.md").read_text()
  diff = float(md.split("max |logits_HF − logits_specjax| = ")[1].split()[0])
  assert diff < 1e-4
  streamed = {r["decoder"]: r for r in rows if r.get("mode") == "forced"}
  assert set(streamed) == {"padded autoregressive", "padded speculative γ=2",
                           "stream autoregressive", "stream speculative γ=2"}
  assert all(r["same_tokens"] and 0 < r["slot_utilization"] <= 1 for r in streamed.values())


def test_bad_pair_name_is_named():
  with pytest.raises(ValueError, match="unknown pair"):
    common.load_pair("summarize")


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


def test_profile_round_accounts_for_a_round(capsys):
  from experiments import profile_round  # pylint: disable=import-outside-toplevel
  profile_round.main(["--cache_lens", "256", "--gammas", "2", "--batches", "2",
                      "--new_tokens", "12", "--repeats", "1"])
  out = capsys.readouterr().out
  steps, rounds = _markdown_tables(out)
  assert len(steps) == len(rounds) == 1
  step, row = steps[0], rounds[0]
  assert (step["L"], step["B"], row["L"], row["B"], row["γ"]) == ("256", "2", "256", "2", "2")
  for name in ("target 1-token call ms", "draft 1-token call ms", "AR call / tokens ms",
               "floor ms"):
    assert float(step[name]) > 0, name
  for name in ("target γ+1 call ms", "draft proposal ms", "verification ms", "call / rounds ms",
               "r", "c", "E[tokens]", "predicted speedup", "measured speedup"):
    assert float(row[name]) > 0, name
  # Slopes between two budgets (12 and 6 tokens, one repeat): timing noise can give them
  # either sign here, so only that they are numbers is asserted.
  for table, name in ((step, "AR step ms"), (step, "AR call fixed ms"), (row, "round ms"),
                      (row, "call fixed ms"), (row, "unaccounted %")):
    assert math.isfinite(float(table[name])), name
  assert 0 <= float(row["α"]) <= 1 and 1 <= float(row["E[tokens]"]) <= 3
  # 12 tokens at γ = 2 take between ceil(12 / 3) = 4 rounds (all accepted) and 12 (none).
  assert 4 <= int(row["rounds"]) <= 12


def test_stream_round_sets_the_stream_beside_its_parts(tmp_path, capsys):
  from experiments import stream_round  # pylint: disable=import-outside-toplevel
  stream_round.main(["--slots", "2", "--inputs", "3", "--gammas", "1", "--new_tokens", "8",
                     "--repeats", "1", "--output_dir", str(tmp_path)])
  (row,), = _markdown_tables(capsys.readouterr().out)
  assert (row["B"], row["γ"]) == ("2", "1")
  for name in ("t_1 ms", "t_γ+1 ms", "proposal ms", "verification ms", "parts ms", "r", "c",
               "free-draft bound", "extra tokens GFLOP/s"):
    assert float(row[name]) > 0, name
  parts = float(row["t_γ+1 ms"]) + float(row["proposal ms"]) + float(row["verification ms"])
  assert math.isclose(float(row["parts ms"]), parts, rel_tol=0.02)
  # A slot's round emits 1 .. γ+1 tokens; idle slots at the stream's tail only lower the mean.
  assert 0 < float(row["tokens / round"]) <= 2
  # Slopes (8 and 1 tokens, one repeat) may take either sign on a busy machine: numbers only.
  for name in ("AR step ms", "round ms", "gap %", "measured speedup", "speedup at parts"):
    assert math.isfinite(float(row[name])), name
  assert "| B | γ |" in (tmp_path / "stream_round.md").read_text()
  with pytest.raises(ValueError, match="gammas must be an integer >= 1"):
    stream_round.main(["--gammas", "0"])


def test_bench_sampler_sets_the_two_samplers_side_by_side(tmp_path, capsys):
  from experiments import bench_sampler  # pylint: disable=import-outside-toplevel
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
