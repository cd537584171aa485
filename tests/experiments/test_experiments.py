"""The experiment modules that reproduce the paper's tables and figures, and the HF-peer bench,
in fast mode on the bundled pairs: they run and write their files (the profiling benches:
tests/experiments/test_experiments_profiling.py)."""
import csv
import json
import math

import pytest

from experiments.bench import speedup as bench
from experiments.paper import figure1, table1, table2_speedup, table3_alpha, table5_lenience
from experiments.common.pairs import RANDOM_NOTE, load_pair
from specjax.analysis import expected_tokens
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
  assert RANDOM_NOTE in (tmp_path / "table3_alpha.md").read_text()
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
    # c in a round: the paired loop less the target's call, per draft step (timing: finite,
    # and its speedup is E[tokens] over that round's cost)
    assert math.isfinite(r["c_round"])
    expect = float(expected_tokens(r["alpha"], r["gamma"]))
    assert r["EXP_CPU_round"] == pytest.approx(
        expect / (r["gamma"] * r["c_round"] + r["r"]), rel=1e-6)
  assert "EXP_CPU_round" in (tmp_path / "table2_speedup.md").read_text()


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
    load_pair("summarize")
