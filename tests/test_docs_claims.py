"""Small claims of the manual checked against what the code and the sample output say: what
--help calls the default run, what the EN->DE run's header and README line say it does, why
greedy outputs may differ, the demo's repetitive text, what dividing the printed figures gives,
the Tests section's "every test", and the feature-draft snippet's imports and output."""
import re

import gin

from specjax.app import gin_config
from specjax.app.cli import gin_listing
from tests.test_docs import EXTENDED_TEST_COMMAND, ROOT, code_blocks, summary_values

README = (ROOT / "README.md").read_text()


def _listing_lines():
  """{run file: its --help line} of the bundled run files."""
  return {m.group(1): m.group(2) for m in
          re.finditer(r"^\s+(runs/\S+\.gin)\s+(.*)$", gin_listing(), re.M)}


def test_help_calls_only_the_default_run_the_default():
  lines = _listing_lines()
  assert "runs/default.gin" in lines and "default" in lines["runs/default.gin"]
  wrong = {name: line for name, line in lines.items()
           if name != "runs/default.gin" and re.search(r"default run|main job's default", line)}
  assert not wrong, wrong


def _header(name):
  """The leading comment lines of a gin file, joined."""
  text = (gin_config.GIN_DIR / name).read_text()
  return " ".join(l.lstrip("# ") for l in text.splitlines() if l.startswith("#"))


def claims_against_run(text, values):
  """What `text` (a header or README line) gets wrong about a run with these macro values."""
  wrong = []
  policy = values["GAMMA_POLICY"]
  if f"'{policy}'" not in text and f"`{policy}`" not in text:
    wrong.append(f"policy {policy} not named")
  if not re.search(rf"batch\s+{values['BATCH_SIZE']}\b", text):
    wrong.append(f"batch {values['BATCH_SIZE']} not named")
  if policy == "auto" and re.search(r"greedy, γ = \d", text):
    wrong.append("says a fixed γ under 'auto'")
  return wrong


def test_the_translate_run_says_what_it_does():
  gin.clear_config()
  try:
    gin_config.parse(["runs/bundled_translate.gin"], [])
    values = {n: gin_config.query_macro(n) for n in ("GAMMA_POLICY", "BATCH_SIZE",
                                                     "MAX_NEW_TOKENS")}
  finally:
    gin.clear_config()
  header = _header("runs/bundled_translate.gin")
  assert not claims_against_run(header, values), claims_against_run(header, values)
  assert f"{values['MAX_NEW_TOKENS']} new tokens" in header
  bullet = re.search(r"^- `--gin_file=runs/bundled_translate.gin`:(.*?)(?=^- )", README,
                     re.M | re.S).group(1)
  assert not claims_against_run(bullet, values), claims_against_run(bullet, values)
  assert "autoregressively" in bullet  # what 'auto' ends up doing there, and why
  # The header as it was: "greedy, γ = 4" under 'auto' at batch 8.
  assert claims_against_run("The bundled pair, greedy, γ = 4, on the translation examples.",
                            values)


def _how_to_read():
  start = README.index("How to read it:")
  return README[start:README.index("\n\n", start)]


def test_the_sameness_claim_says_when_greedy_outputs_differ():
  paragraph = _how_to_read()
  assert "emit the same tokens" in paragraph
  assert "greedy_verdict" in paragraph and "tie" in paragraph


def _first_run():
  return README[README.index("<!-- first-run:start -->"):README.index("<!-- first-run:end -->")]


def test_the_demo_texts_repetition_is_said_before_the_sample():
  sample = _first_run()
  repeats = re.search(r"\b(\w+) the \1\b", sample)  # "enumerate the enumerate"
  if repeats:
    before = README[:README.index("<!-- first-run:start -->")].rsplit("\n\n", 2)[-2:]
    assert "repeats itself" in " ".join(before), "the sample repeats itself without a word"


def _rounding_interval(printed):
  """[low, high) of the values that print as `printed` (its last digit's half unit)."""
  decimals = len(printed.split(".")[1]) if "." in printed else 0
  half = 0.5 * 10 ** -decimals
  return float(printed) - half, float(printed) + half


def consistent(ar, spec, speedup):
  """Whether some unrounded figures that print as `ar` and `spec` divide into a value that
  prints as `speedup` (the printed figures are each rounded)."""
  ar_lo, ar_hi = _rounding_interval(ar)
  spec_lo, spec_hi = _rounding_interval(spec)
  lo, hi = _rounding_interval(speedup)
  return ar_lo / spec_hi < hi and ar_hi / spec_lo > lo


def test_dividing_the_printed_figures_gives_the_speedup_up_to_rounding():
  values = summary_values(_first_run())
  assert consistent(values["autoregressive_ms_per_token"], values["speculative_ms_per_token"],
                    values["speedup"])
  assert "up to their rounding" in _how_to_read()
  assert consistent("1.92", "1.39", "1.37") and not consistent("7.44", "4.74", "1.67")


def test_the_tests_section_names_the_core_set_and_the_rest():
  """The Tests section says the command at the top runs the core set, and its command block is
  the extended set's, which `.ci/run` runs too (so that every test runs on CI)."""
  section = README[README.index("## Tests"):README.index("## The manual")]
  assert "runs the core set" in section and "every test" in section
  listed = [line for _, _, code, _ in code_blocks(section) for line in code.splitlines()
            if "pytest" in line]
  assert listed and all(line.strip(" \\&") in EXTENDED_TEST_COMMAND for line in listed), listed


def test_the_feature_draft_snippet_imports_what_it_uses_and_prints():
  text = (ROOT / "docs" / "feature_drafts.md").read_text()
  code = next(c for lang, _, c, _ in code_blocks(text) if lang == "python" and "FeatureDrafter"
              in c)
  assert "print(" in code
  for name in ("tree_decode", "StaticTree", "DecodeConfig"):
    assert name in code and re.search(rf"^from \S+ import .*\b{name}\b", code, re.M), name
  assert re.search(r"DecodeConfig\(\)` samples at temperature 1", text)
