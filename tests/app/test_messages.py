"""The one-line messages a new user meets first: an unquoted gin string, a missing input file, a
misspelled task (fast, without TensorFlow's start-up lines), a summary value of several lines,
and what README says sampling.gin verifies with."""
import os
import pathlib
import re
import subprocess
import sys

import gin
import pytest
from rich.console import Console

from specjax.app import gin_config, main, report
from specjax.app.settings import job_verifier
from specjax.data.seqio_import import quiet_stderr
from specjax.sampling import Sampling
from specjax.verify import describe

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _clear_gin():
  gin.clear_config()
  yield
  gin.clear_config()


@pytest.mark.parametrize("binding, message", [
    ("GAMMA_POLICY=auto", "--gin.GAMMA_POLICY=auto: auto is not a gin value (a string must be "
                          "quoted): write --gin.GAMMA_POLICY=\"'auto'\""),
    ("OUTPUT_DIR=/tmp/out", "--gin.OUTPUT_DIR=/tmp/out: /tmp/out is not a gin value (a string "
                            "must be quoted): write --gin.OUTPUT_DIR=\"'/tmp/out'\""),
    ("IGNORE_EOS=true", "--gin.IGNORE_EOS=true: true is not a gin value (gin writes True "
                        "capitalized): write --gin.IGNORE_EOS=True"),
])
def test_an_unquoted_gin_string_says_to_quote_it_with_the_corrected_flag(binding, message):
  with pytest.raises(ValueError) as error:
    gin_config.parse(["runs/random_tiny.gin"], [binding])
  assert str(error.value) == message


def test_an_unquoted_string_in_a_gin_file_names_the_file_and_line(tmp_path):
  path = tmp_path / "mine.gin"
  path.write_text("include 'runs/random_tiny.gin'\nGAMMA_POLICY = auto\n")
  with pytest.raises(ValueError, match=re.escape(
      f"gin: '{path}', line 2: auto is not a gin value (a string must be quoted): "
      "write GAMMA_POLICY = 'auto'")):
    gin_config.parse([str(path)], [])


def test_a_missing_input_file_is_named_by_its_flag(capsys):
  assert main.cli(["--input_file=/nonexistent/inputs.txt"]) == 2
  assert capsys.readouterr().err.strip().splitlines()[-1] == (
      "specjax: error: --input_file '/nonexistent/inputs.txt': No such file or directory")


def test_a_misspelled_task_errors_at_once_without_importing_tensorflow():
  code = ("import sys\nfrom specjax.data import inputs\ntry:\n"
          "  inputs.task_inputs('translate_en_dee', 4)\nexcept ValueError as e:\n  print(e)\n"
          "print('seqio' in sys.modules, 'tensorflow' in sys.modules)")
  out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, check=True)
  assert out.stdout.splitlines() == [
      "unknown task 'translate_en_dee' (did you mean 'translate_en_de'?): neither a bundled "
      "split (['lm_ddtp_en', 'summarize_ddtp', 'translate_en_de']) nor a registered seqio task "
      "or mixture (register yours by importing its module: MIXTURE_OR_TASK_MODULE or an "
      "`import` in your gin file)", "False False"]
  assert out.stderr == ""


def test_what_cpp_writes_to_stderr_while_seqio_imports_is_dropped(capfd):
  with quiet_stderr():
    os.write(2, b"cudart_stub.cc:31] Could not find cuda drivers\n")
  os.write(2, b"after\n")
  assert capfd.readouterr().err == "after\n"


def test_a_summary_value_of_several_lines_prints_as_lines():
  console = Console(record=True, width=120)
  console.print(report.summary_table({"greedy_difference": "row 3: token 5 differs\n"
                                                          "row 7: token 2 differs"}))
  text = console.export_text()
  assert "\\n" not in text
  assert re.search(r"row 3: token 5 differs\s*│\n│\s+│\s+row 7: token 2 differs", text), text


def test_readme_says_which_verifier_sampling_gin_runs():
  readme = (ROOT / "README.md").read_text()
  bullet = re.search(r"^- `--gin_file=decoding/sampling.gin`:(.*?)(?=^- )", readme,
                     re.M | re.S).group(1)
  verifier = describe(job_verifier(None, "model", None, Sampling(temperature=1.0), 1.0))
  assert verifier == "block (exact)" and f"`{verifier}`" in bullet
