"""A feature head's folder against a hostile file system: its token ranking is read only from
a regular file inside the folder, no larger than a ranking of the head's vocabulary, parsed
from its header before any array is made, every error naming the file, and refused before
any weights load; head training writes it through a fresh temporary, never a planted link,
finds a shipped target from any folder and ends with a line of valid JSON."""
import json
import math
import os
import shutil
import subprocess
import sys
import types

import gin
import numpy as np
import pytest

from specjax.app import run, train_main
from specjax.draft import FeatureDrafter
from specjax.draft.ranking import RANKING_FILE, load_token_ranking
from specjax.models import FeatureHead, FeatureHeadConfig
from specjax.testing import tiny_pair
from specjax.train import feature_head as head_training
from specjax.train.checkpoints import read_trained_folder

V = 16
EAGLE = os.path.join(os.path.dirname(__file__), "..", "specjax", "assets", "pairs", "lm", "eagle")
GIN = os.path.join(os.path.dirname(__file__), "..", "gin")


def gin_config_text(name):
  with open(os.path.join(GIN, name), encoding="utf-8") as f:
    return f.read()


def _npy_claiming(count):
  """A 128-byte .npy header for int32 [count], with no data behind it."""
  header = f"{{'descr': '<i4', 'fortran_order': False, 'shape': ({count},), }}"
  header += " " * (117 - len(header)) + "\n"
  return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode()


def test_a_ranking_is_read_safely_and_named(tmp_path):
  path = tmp_path / RANKING_FILE
  path.write_bytes(_npy_claiming(10**11))  # numpy asked for 373 GiB (MemoryError)
  with pytest.raises(ValueError, match=f"the token ranking {path} claims 100000000000 entries "
                                       "but holds 0 bytes"):
    load_token_ranking(tmp_path, V)
  path.write_text("not an array\n")  # numpy suggested allow_pickle, naming no file
  with pytest.raises(ValueError, match=f"the token ranking {path} is not an .npy array"):
    load_token_ranking(tmp_path, V)
  np.save(path, np.arange(V + 1))  # a ranking of another vocabulary: refused, named
  with pytest.raises(ValueError, match=rf"{path} must list the head's 16 token ids, got shape "
                                       r"\(17,\)"):
    load_token_ranking(tmp_path, V)
  path.unlink()
  os.mkfifo(path)  # skipped silently: the head drafted ids 0..K-1
  with pytest.raises(ValueError, match=f"the token ranking {path} is a FIFO"):
    load_token_ranking(tmp_path, V)
  path.unlink()
  secret = tmp_path / "elsewhere.npy"
  np.save(secret, np.arange(V))
  (tmp_path / "head").mkdir()
  (tmp_path / "head" / RANKING_FILE).symlink_to(secret)  # a link out of the head's folder
  with pytest.raises(ValueError, match="is a link to .*elsewhere.npy, outside the head's folder"):
    load_token_ranking(tmp_path / "head" / "checkpoint_3", V)
  np.save(path, np.arange(V)[::-1])
  np.testing.assert_array_equal(load_token_ranking(tmp_path / "checkpoint_9", V),
                                np.arange(V)[::-1])


def test_head_training_writes_its_ranking_never_through_a_link(tmp_path):
  # np.save went to token_ranking.npy.tmp.npy, following a link planted there.
  precious = tmp_path / "precious"
  precious.write_text("mine")
  (tmp_path / "token_ranking.npy.tmp.npy").symlink_to(precious)
  (tmp_path / RANKING_FILE).symlink_to(tmp_path / "victim.npy")  # dangling
  features = {"decoder_target_tokens": np.array([[3, 3, 5]]),
              "decoder_loss_weights": np.array([[1, 1, 1]])}
  head_training._write_token_ranking(str(tmp_path), features, V)  # pylint: disable=protected-access
  assert precious.read_text() == "mine" and not (tmp_path / "victim.npy").exists()
  assert not (tmp_path / RANKING_FILE).is_symlink()
  assert load_token_ranking(tmp_path, V)[:2].tolist() == [3, 5]


def test_the_heads_cache_is_counted_in_the_memory_checks():
  pair = tiny_pair("lm")
  config = pair.target.config
  head = FeatureHead(FeatureHeadConfig(vocab_size=config.vocab_size, emb_dim=config.emb_dim,
                                       num_heads=2, head_dim=8, mlp_dim=16))
  assert FeatureDrafter(pair.target, head, max_gamma=2).models == (head,)


@pytest.fixture
def no_weights(monkeypatch):
  def fail(*args, **kwargs):
    raise AssertionError("weights were loaded or initialized before the check")
  monkeypatch.setattr("specjax.app.measure.load_params", fail)
  gin.clear_config()
  yield
  gin.clear_config()


def test_a_wrong_ranking_is_refused_before_weights_load(tmp_path, no_weights):
  # A ranking of the wrong length was refused after the weights loaded, naming no file.
  head = tmp_path / "eagle"
  shutil.copytree(EAGLE, head)
  np.save(head / RANKING_FILE, np.arange(100, dtype=np.int32))
  with pytest.raises(ValueError, match=f"the token ranking {head / RANKING_FILE} must list the "
                                       r"head's \d+ token ids, got shape \(100,\)"):
    run(["--gin_file=runs/bundled_lm_eagle.gin", f"--gin.DRAFT_CHECKPOINT='{head}'",
         "--prompt", "x", f"--gin.OUTPUT_DIR='{tmp_path}/out'"])


def test_head_training_finds_its_target_from_any_folder(tmp_path, monkeypatch):
  # TARGET was 'specjax/assets/pairs/lm/target', relative to the working folder, and
  # 'bundled:lm/target' was not accepted there.
  monkeypatch.chdir(tmp_path)
  folder, config = read_trained_folder("bundled:lm/target", "feature head target")
  assert os.path.samefile(folder, os.path.join(EAGLE, "..", "target"))
  assert config.vocab_size == 8192
  with pytest.raises(ValueError, match="must name a shipped model as 'bundled:PAIR/ROLE'"):
    read_trained_folder("bundled:../../etc", "feature head target")
  assert gin_config_text("runs/train_lm_eagle.gin").count("TARGET = 'bundled:lm/target'") == 1


def test_the_training_summary_line_is_valid_json():
  # A head's run ended with "tokens_per_second": NaN, which no JSON parser accepts.
  result = types.SimpleNamespace(step=6, checkpoint="/m/checkpoint_6", evals=[{"loss": math.inf}],
                                 tokens_per_second=math.nan)
  assert json.loads(train_main.summary_line(result)) == {
      "step": 6, "checkpoint": "/m/checkpoint_6", "tokens_per_second": None,
      "validation": {"loss": None}}


def test_experiments_keep_the_one_line_contract(tmp_path):
  # bench_eagle --head with a hostile ranking printed numpy's traceback, naming no file.
  head = tmp_path / "eagle"
  shutil.copytree(EAGLE, head)
  (head / RANKING_FILE).write_bytes(_npy_claiming(10**11))
  root = os.path.join(os.path.dirname(__file__), "..")
  proc = subprocess.run([sys.executable, "-m", "experiments.bench.eagle", "--fast", "--head",
                         str(head), "--output_dir", str(tmp_path / "out")], cwd=root,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr
  assert proc.stderr.strip().splitlines()[-1] == (
      f"specjax: error: the token ranking {head / RANKING_FILE} claims 100000000000 entries "
      "but holds 0 bytes of data")
