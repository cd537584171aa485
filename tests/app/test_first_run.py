"""What the main job's summary says: per-token figures, speculation switched off and why, and the
user-facing errors of a first run (a foreign vocabulary on a bundled pair, a misspelled macro,
a missing extra, the README's own-checkpoint example)."""
import json
import pathlib
import re
import sys

import gin
import jax
import pytest

from specjax import timing
from specjax.app import gin_config, report, run
from specjax.checkpoints import save_t5x
from specjax.models import build_model

ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY = "runs/random_tiny.gin"


@pytest.fixture(autouse=True)
def _clear_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def test_speedup_is_the_ratio_of_per_token_times():
  # The speculative decode emitted half the tokens in half the time: the same rate per token,
  # so no speedup, although its walltime is half (what a walltime ratio would report).
  timings = timing.Timings(samples={"ar": (2.0, 2.2, 1.8), "spec": (1.0, 1.0, 1.0)},
                           compile_s={"ar": 0.0, "spec": 0.0}, outputs={})
  speedup, low, high = report.per_token_speedup(timings, ar_tokens=200, spec_tokens=100)
  assert speedup == pytest.approx(1.0) and low == pytest.approx(0.9) and high == pytest.approx(1.1)
  speedup, _, _ = report.per_token_speedup(timings, ar_tokens=100, spec_tokens=100)
  assert speedup == pytest.approx(2.0)


def test_speedup_is_the_ratio_of_the_medians_within_the_per_pass_range():
  # Per pass the ratios are 4.0, 0.8 and 1.0 (median 1.0); the medians are 3.0 s and 2.5 s.
  # The summary prints the medians as ms per token, so the speedup is their ratio, 1.2.
  timings = timing.Timings(samples={"ar": (4.0, 2.0, 3.0), "spec": (1.0, 2.5, 3.0)},
                           compile_s={"ar": 0.0, "spec": 0.0}, outputs={})
  speedup, low, high = report.per_token_speedup(timings, ar_tokens=100, spec_tokens=100)
  assert speedup == pytest.approx(1.2) and low == pytest.approx(0.8)
  assert high == pytest.approx(4.0)


def _printed_rows(text):
  """The summary table's rows as printed: metric -> value (both as text)."""
  return dict(re.findall(r"^\W*\s(\w+)\s+\W\s+(\S.*?)\s+\W\s*$", text, re.MULTILINE))


def _job(tmp_path, *bindings, prompts=("Hello world",)):
  args = [f"--gin_file={TINY}", "--plain", f"--gin.OUTPUT_DIR='{tmp_path / 'out'}'",
          "--gin.BATCH_SIZE=1", *bindings]
  for p in prompts:
    args += ["--prompt", p]
  return run(args)


def test_sampled_run_reports_both_decodes_tokens_and_rates(tmp_path):
  summary = _job(tmp_path, "--gin.MAX_NEW_TOKENS=12", "--gin.GAMMA_POLICY='constant'",
                 "--gin.GAMMA=2", "--gin_file=decoding/sampling.gin",
                 prompts=("Hello world", "A second input", "and a third"))
  for name in ("autoregressive", "speculative"):
    tokens = summary[f"{name}_tokens"]
    assert 3 <= tokens <= 36
    assert summary[f"{name}_ms_per_token"] == pytest.approx(
        1e3 * summary[f"{name}_s"] / tokens)
  assert summary["speculating_rounds"].endswith("(100%)")
  low, high = map(float, summary["speedup_range"].split("-"))
  assert low <= round(summary["speedup"], 2) <= high
  assert "ms per emitted token" in summary["speedup_is"]


def test_a_reader_divides_the_printed_ms_per_token_and_gets_the_speedup(tmp_path, capsys):
  # The settings of the sampled run above: its compiled loops are reused.
  summary = _job(tmp_path, "--gin.MAX_NEW_TOKENS=12", "--gin.GAMMA_POLICY='constant'",
                 "--gin.GAMMA=2", "--gin_file=decoding/sampling.gin",
                 prompts=("Hello world", "A second input", "and a third"))
  assert summary["speedup"] == pytest.approx(
      summary["autoregressive_ms_per_token"] / summary["speculative_ms_per_token"], rel=1e-9)
  out = capsys.readouterr().out
  # The smoke run's first line says why its speedup is below 1, before anything is decoded.
  first = " ".join(out.split("\n\n")[0].split())
  assert first.startswith("Note: a smoke run of two random models:") and (
      "the speedup is below 1; runs/default.gin (no flags) shows speculation paying" in first)
  rows = _printed_rows(out)
  ar, spec, speedup = (float(rows[k]) for k in ("autoregressive_ms_per_token",
                                                "speculative_ms_per_token", "speedup"))
  # Three significant digits each: the reader's division is within 1.5% of the printed value.
  assert ar / spec == pytest.approx(speedup, rel=0.015)
  low, high = map(float, rows["speedup_range"].split("-"))
  assert low <= round(summary["speedup"], 2) <= high
  assert rows["gamma"] == "2"


def test_a_run_that_never_speculates_says_so_and_why(tmp_path, capsys):
  table = tmp_path / "costs.json"
  common = ("--gin.MAX_NEW_TOKENS=6", "--gin.GAMMA_POLICY='auto'", f"--gin.COST_TABLE='{table}'")
  _job(tmp_path, *common)  # calibrates and writes the table
  gin.clear_config()
  data = json.loads(table.read_text())
  data["seconds"] = [data["seconds"][0]] + [100 * data["seconds"][0]] * (len(data["seconds"]) - 1)
  table.write_text(json.dumps(data))
  capsys.readouterr()
  summary = _job(tmp_path, *common)
  printed = " ".join(capsys.readouterr().out.split())
  assert summary["speculating_rounds"].startswith("0 of ")
  assert summary["speedup"].startswith("n/a: speculation was off")
  reason = summary["speculation_off"]
  assert re.search(r"speculation was off in \d+ of \d+ rounds: the 'auto' policy measured "
                   r"α = [0-9.]+, a draft step costs c = [0-9.]+ target steps, and a γ = 1 "
                   r"round costs [0-9.]+ autoregressive steps, so ", reason)
  assert "--gin.GAMMA_POLICY=\"'constant'\"" in reason
  assert "Note: speculation was off in" in printed
  # No speedup, so no range of it, and no γ: no round played one.
  assert "speedup_range" not in summary and "gamma" not in summary
  assert "speedup_range" not in printed and " gamma " not in printed
  assert "speedup_range" not in summary["speedup_is"]


def test_break_even_alpha_solves_eq_1():
  assert report.break_even_alpha(1.5, 1) == pytest.approx(0.5)
  alpha = report.break_even_alpha(2.0, 2)  # 1 + a + a^2 = 2
  assert alpha == pytest.approx((5 ** 0.5 - 1) / 2)
  assert report.break_even_alpha(2.5, 1) is None  # a γ = 1 round emits at most 2 tokens


@pytest.fixture(scope="module")
def foreign_spm(tmp_path_factory):
  """A SentencePiece model that is not the bundled pairs' (trained here on a few lines)."""
  import sentencepiece as spm  # pylint: disable=import-outside-toplevel
  folder = tmp_path_factory.mktemp("spm")
  text = folder / "text.txt"
  text.write_text("\n".join(f"line {i} of a small corpus about house and tree" for i in range(200)))
  spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(folder / "foreign"),
                                 vocab_size=40, model_type="unigram", minloglevel=2, pad_id=0,
                                 eos_id=1, unk_id=2, bos_id=-1)
  return folder / "foreign.model"


def test_a_foreign_vocabulary_on_a_bundled_pair_names_both(foreign_spm, monkeypatch):
  monkeypatch.setattr("specjax.app.job.load", lambda plan: pytest.fail("weights loaded"))
  with pytest.raises(ValueError, match=r"VOCABULARY \(.*foreign\.model.*\) is not the vocabulary "
                                       r"the bundled checkpoints \(bundled:\w+/target, "
                                       r"bundled:\w+/draft\) were trained with "
                                       r"\(.*specjax_8k.*\)"):
    run(["--prompt", "x", f"--gin.VOCABULARY='{foreign_spm}'"])


def test_a_missing_extra_is_named(tmp_path, monkeypatch):
  run_file = tmp_path / "needs_seqio.gin"
  run_file.write_text("from __gin__ import dynamic_registration\nimport seqio\n"
                      f"include '{TINY}'\n")
  monkeypatch.setitem(sys.modules, "seqio", None)  # as if not installed
  with pytest.raises(ModuleNotFoundError, match=r"imports seqio, which is not installed: install "
                                                r"specjax's 'seqio' extra"):
    gin_config.parse([str(run_file)], [])


def _readme_example() -> str:
  """The gin file of the README's "own T5X checkpoints" example (the fenced block after the
  `<!-- example: own-t5x -->` marker)."""
  text = (ROOT / "README.md").read_text()
  found = re.search(r"<!-- example: own-t5x -->\s*```[a-z]*\n(.*?)```", text, re.S)
  assert found, "README.md lost its own-T5X-checkpoints example (marker example: own-t5x)"
  return found.group(1)


def test_the_readme_own_checkpoint_example_runs(tmp_path):
  """The example as written, with its /path/to/ placeholders pointed at checkpoints and a
  SentencePiece model that exist here (tiny T5 1.1 models stand in for XXL and Small)."""
  pytest.importorskip("seqio")  # CI installs the seqio extra; the example imports seqio
  example = _readme_example()
  tiny = build_model(gin_config.model_config_from_file("models/t5_1_1_tiny.gin"))
  for name in ("t5_1_1_xxl", "t5_1_1_small"):
    save_t5x(tiny.init(jax.random.PRNGKey(0)), str(tmp_path / name), step=1000000,
             dtype="float32")
  gin.clear_config()
  spm_file = ROOT / "specjax" / "assets" / "spm" / "specjax_8k.model"
  example = re.sub(r"'/path/to/(t5_1_1_\w+)/checkpoint_1000000'",
                   lambda m: f"'{tmp_path / m.group(1)}'", example)
  example = re.sub(r"'/path/to/[^']*\.model'", f"'{spm_file}'", example)
  assert "/path/to" not in example
  (tmp_path / "my_t5.gin").write_text(example)
  summary = run([f"--gin_file={tmp_path / 'my_t5.gin'}", "--plain",
                 "--gin.TARGET_MODEL='models/t5_1_1_tiny.gin'",
                 "--gin.DRAFT_MODEL='models/t5_1_1_tiny.gin'", "--gin.MAX_NEW_TOKENS=4",
                 f"--gin.OUTPUT_DIR='{tmp_path / 'out'}'",
                 "--prompt", "translate English to German: The house is wonderful."])
  assert summary["examples"] == 1 and summary["greedy_identical"] is True

