"""experiments.bench.auto in fast mode: it runs, writes its files and reports every decoder.

Only the plumbing is checked: timings (and so `meets_bar`) are never a pass/fail test.
"""
import json

from experiments.bench import auto as bench_auto


def test_bench_auto_fast_writes_its_table(tmp_path):
  rows = bench_auto.main(["--fast", "--pair", "translate", "--output_dir", str(tmp_path)])
  for name in ("bench_auto.md", "bench_auto.csv", "bench_auto_timings.csv", "bench_auto.json"):
    assert (tmp_path / name).stat().st_size > 0, name
  assert [(r["pair"], r["batch"], r["T"]) for r in rows] == [("translate", 1, 0.0)]
  row = rows[0]
  assert row["best"] in ("autoregressive", "γ=1")
  assert row["repeats"] >= 1 and row["duel_repeats"] >= 1
  assert row["auto_vs_ar"] > 0 and row["auto_vs_best"] > 0 and isinstance(row["meets_bar"], bool)
  rounds = dict(pair.split(":") for pair in row["auto_rounds_by_gamma"].split())
  assert set(rounds) <= {"0", "1"} and sum(map(int, rounds.values())) >= 1
  saved = json.loads((tmp_path / "bench_auto.json").read_text())
  assert {t["decoder"] for t in saved["timings"]} == {"autoregressive", "γ=1", "auto"}
  assert "meets_bar" in (tmp_path / "bench_auto.md").read_text()
