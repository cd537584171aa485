"""Model gin files that try to read the machine (docs/results/hostile_probe.md, second part):
includes of devices and system files, include cycles, and a --model_gin spliced into gin.
A model gin file is read only when it is a regular file of at most 1 MiB, its includes
only from the gin search paths and its own folder, and no line of it is echoed."""
import os
import subprocess
import sys
import textwrap

import pytest

from specjax.app import gin_config
from specjax.models import read_model_gin

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LM = "".join(f"DecoderOnlyConfig.{k} = {v!r}\n" for k, v in dict(
    vocab_size=10, emb_dim=8, num_heads=2, head_dim=4, mlp_dim=8, num_layers=1).items())


def _run_capped(code, tmp_path, timeout=60):
  """Runs `code` in a Python whose address space is capped at 3 GiB (reading /dev/zero until
  memory runs out then ends in MemoryError instead of taking the machine's memory)."""
  prelude = "import resource\nresource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))\n"
  return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], cwd=tmp_path,
                        env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True,
                        timeout=timeout)


@pytest.mark.parametrize("model_file, message", [
    ("/dev/zero", "/dev/zero is a character device, not a regular file"),
    ("model.gin", "include '/dev/zero' resolves to /dev/zero, outside the gin search paths"),
])
def test_dev_zero_as_a_model_gin_or_an_include_is_refused(tmp_path, model_file, message):
  # Both were read until memory ran out.
  (tmp_path / "model.gin").write_text(LM + "include '/dev/zero'\n")
  code = f"""
      from specjax.app import gin_config
      try:
        gin_config.parse([], ["TARGET_MODEL = {model_file!r}"])
      except ValueError as e:
        print("ValueError:", e)
      """
  result = _run_capped(code, tmp_path)
  assert result.returncode == 0, result.stderr[-1500:]
  assert message in result.stdout


def test_an_include_of_a_system_file_is_refused_and_nothing_of_it_is_echoed(tmp_path):
  # /etc/passwd was read, and its first line shown in the error.
  (tmp_path / "model.gin").write_text(LM + "include '/etc/passwd'\n")
  for read in (lambda: read_model_gin(str(tmp_path)),
               lambda: gin_config.read_model_file(str(tmp_path / "model.gin"))):
    with pytest.raises(ValueError, match="include '/etc/passwd' resolves to /etc/passwd, "
                       "outside the gin search paths") as e:
      read()
    with open("/etc/passwd", encoding="utf-8") as f:
      assert f.readline().split(":")[0] + ":" not in str(e.value)


def test_a_line_that_is_not_allowed_is_named_by_its_line_not_echoed(tmp_path):
  (tmp_path / "model.gin").write_text(LM + "secret:x:0:0:hunter2\n")
  with pytest.raises(ValueError, match=r"model.gin:7: this line is not allowed") as e:
    read_model_gin(str(tmp_path))
  assert "hunter2" not in str(e.value)


@pytest.mark.parametrize("include", ["model.gin", "./model.gin", "../model/model.gin"])
def test_a_self_include_is_one_line_not_a_recursion_error(tmp_path, include):
  # './model.gin' escaped the cycle check (another spelling): a 3,271-line RecursionError.
  folder = tmp_path / "model"
  folder.mkdir()
  (folder / "model.gin").write_text(LM + f"include '{include}'\n")
  with pytest.raises(ValueError, match="include cycle: model.gin -> model.gin") as e:
    read_model_gin(str(folder))
  assert "\n" not in str(e.value)
  with pytest.raises(ValueError, match="include cycle"):
    gin_config.read_model_file(include, [str(folder)])


def test_a_chain_of_includes_is_bounded(tmp_path):
  for i in range(20):
    (tmp_path / f"m{i}.gin").write_text(f"include 'm{i + 1}.gin'\n")
  (tmp_path / "m20.gin").write_text(LM)
  with pytest.raises(ValueError, match="includes nested more than 16 deep"):
    gin_config.read_model_file("m0.gin", [str(tmp_path)])
  (tmp_path / "m4.gin").write_text(LM)  # a chain of 4 is fine
  assert gin_config.read_model_file("m0.gin", [str(tmp_path)])[1]["emb_dim"] == 8


def test_export_hf_model_gin_is_a_file_name_not_gin_text(tmp_path):
  # --model_gin was spliced into "TARGET_MODEL = '...'": a crafted value imported a module.
  (tmp_path / "planted.py").write_text("open('IMPORTED', 'w').close()\n")
  crafted = "models/t5_1_1_small.gin'\nimport planted\nX = '"
  env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{tmp_path}")
  result = subprocess.run([sys.executable, "-m", "specjax.app.export_hf", "--checkpoint",
                           str(tmp_path / "none"), "--model_gin", crafted, "--out",
                           str(tmp_path / "out")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
  assert not (tmp_path / "IMPORTED").exists()
  assert result.returncode != 0 and "not found" in result.stderr, result.stderr[-1500:]


def test_export_hf_out_is_checked_first_and_an_earlier_export_is_replaced_whole(tmp_path):
  pytest.importorskip("torch")
  import jax  # pylint: disable=import-outside-toplevel
  from specjax.app import export_hf  # pylint: disable=import-outside-toplevel
  from specjax.models.t5 import T5Config, T5Model  # pylint: disable=import-outside-toplevel
  afile = tmp_path / "afile"
  afile.write_text("mine")
  with pytest.raises(ValueError, match="--out .*afile is a file or a link, not a folder"):
    export_hf.main(["--checkpoint", str(tmp_path / "none"), "--model_gin",
                    "models/no_such.gin", "--out", str(afile)])  # before the model is read
  notes = tmp_path / "notes"
  notes.mkdir()
  (notes / "todo.txt").write_text("mine")
  with pytest.raises(ValueError, match="holds no HF model .* refusing to replace it"):
    export_hf.check_out_dir(str(notes))
  # An earlier export's stale files went on sitting beside the new ones.
  config = T5Config(vocab_size=32, emb_dim=8, num_heads=1, num_encoder_layers=1,
                    num_decoder_layers=1, head_dim=8, mlp_dim=8)
  params = T5Model(config).init(jax.random.PRNGKey(0))
  out = tmp_path / "hf"
  export_hf.save_hf(config, params, str(out))
  (out / "model-00001-of-00002.safetensors").write_text("stale")
  export_hf.save_hf(config, params, str(out))
  assert "model-00001-of-00002.safetensors" not in os.listdir(out)
  assert {"config.json", "model.safetensors"} <= set(os.listdir(out))
  assert afile.read_text() == "mine" and (notes / "todo.txt").read_text() == "mine"
  assert sorted(os.listdir(tmp_path)) == ["afile", "hf", "notes"]  # no temporary folder left


def test_files_that_include_each_other_many_times_are_bounded(tmp_path):
  # 8 small files each including the next 10 times: within the depth limit, 10**8 reads.
  for i in range(8):
    (tmp_path / f"m{i}.gin").write_text(f"include 'm{i + 1}.gin'\n" * 10)
  (tmp_path / "m8.gin").write_text(LM)
  with pytest.raises(ValueError, match="more than 64 model gin files read"):
    gin_config.read_model_file("m0.gin", [str(tmp_path)])


@pytest.mark.parametrize("opener", ["(", "'''", "\"\"\""])
def test_an_unclosed_bracket_or_string_is_one_line_and_read_once(tmp_path, opener):
  # 2,000 lines after it took 27 s (the value re-tokenized once per line); 100,000, hours.
  lines = 100_000
  (tmp_path / "model.gin").write_text(LM + f"DecoderOnlyConfig.emb_dim = {opener}8,\n"
                                      + "x = 1\n" * lines)
  with pytest.raises(ValueError, match=r"model.gin:7: .*(a bracket|a string) opened on line 7 "
                     "that is never closed") as e:
    read_model_gin(str(tmp_path))  # linear: well under a second for the 100,000 lines
  assert "\n" not in str(e.value)


def test_a_huge_extra_ids_count_is_refused(tmp_path):
  # extra_ids = 1000000000 was accepted, and building the vocabulary exhausted memory.
  (tmp_path / "model.gin").write_text(
      LM + "seqio.SentencePieceVocabulary.sentencepiece_model_file = 'x.model'\n"
      "seqio.SentencePieceVocabulary.extra_ids = 1000000000\n")
  with pytest.raises(ValueError, match=r"extra_ids must be a count in \[0, 65536\], got "
                     "1000000000"):
    gin_config.read_model_file(str(tmp_path / "model.gin"))
  from specjax.data import Vocab  # pylint: disable=import-outside-toplevel
  from specjax.data.vocab import DEFAULT_MODEL  # pylint: disable=import-outside-toplevel
  with pytest.raises(ValueError, match="extra_ids"):
    Vocab(DEFAULT_MODEL, extra_ids=10**9)


@pytest.mark.parametrize("name", ["enable_named_call", "jit", "set_logical_axis_rules",
                                  "Dense", "__class__"])
def test_mlp_activations_are_only_activation_functions(tmp_path, name):
  # Any flax.linen name was looked up and called ('enable_named_call' gave a traceback).
  (tmp_path / "model.gin").write_text(LM + f"DecoderOnlyConfig.mlp_activations = ({name!r},)\n")
  with pytest.raises(ValueError, match=f"unknown MLP activation '{name}': use one of linear, "
                     "relu, gelu"):
    read_model_gin(str(tmp_path))


def test_a_byte_order_mark_is_read_past(tmp_path):
  (tmp_path / "model.gin").write_text("\ufeff" + LM, encoding="utf-8")
  assert read_model_gin(str(tmp_path)).emb_dim == 8
