"""The main job with a Gemma pair: model gin files binding GemmaConfig, checkpoints in the
gemma library's Orbax layout, the vocabulary a SentencePiece file; and its one-line refusals
(a checkpoint of another size, a draft with another vocabulary, a vocabulary larger than the
model's)."""
import os

import gin
import pytest

from specjax.app import gin_config, run
from specjax.data.vocab import DEFAULT_MODEL
from specjax.models import GEMMA_SIZES, GemmaModel

ocp = pytest.importorskip("orbax.checkpoint")

# A tiny Gemma 3 over the bundled 8k vocabulary: local and global layers, window 4.
TINY = """GemmaConfig.num_embed = {vocab}
GemmaConfig.embed_dim = {width}
GemmaConfig.hidden_dim = 32
GemmaConfig.num_heads = 4
GemmaConfig.head_dim = 8
GemmaConfig.num_kv_heads = 1
GemmaConfig.attention_types = ('local_sliding', 'global')
GemmaConfig.sliding_window_size = 4
GemmaConfig.use_qk_norm = True
GemmaConfig.transpose_gating_einsum = True
GemmaConfig.global_base_frequency = 1000000
"""


@pytest.fixture(autouse=True)
def _clear_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def _model(tmp_path, name, vocab=8192, width=16, save=True):
  """(model gin file, checkpoint folder) of a tiny random Gemma."""
  path = tmp_path / f"{name}.gin"
  path.write_text(TINY.format(vocab=vocab, width=width))
  ckpt = str(tmp_path / f"{name}_ckpt")
  if save:
    model = GemmaModel(gin_config.model_config_from_file(str(path)))
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(ckpt, model.init(len(name)))
    checkpointer.wait_until_finished()
  return str(path), ckpt


def _args(tmp_path, target, draft):
  return ["--gin_file=runs/decode.gin", "--prompt", "Hello world", "--gin.MAX_NEW_TOKENS=6",
          "--gin.BATCH_SIZE=1", "--gin.GAMMA_POLICY='constant'", "--gin.GAMMA=3", "--plain",
          f"--gin.VOCABULARY='{DEFAULT_MODEL}'", f"--gin.OUTPUT_DIR='{tmp_path / 'out'}'",
          f"--gin.TARGET_MODEL='{target[0]}'", f"--gin.TARGET_CHECKPOINT='{target[1]}'",
          f"--gin.DRAFT_MODEL='{draft[0]}'", f"--gin.DRAFT_CHECKPOINT='{draft[1]}'"]


def test_a_gemma_pair_runs_through_the_job(tmp_path):
  target, draft = _model(tmp_path, "target", width=32), _model(tmp_path, "draft")
  summary = run(_args(tmp_path, target, draft))
  assert summary["greedy_identical"] is True and summary["examples"] == 1


def test_gemma_mismatches_are_one_line_each(tmp_path):
  target, draft = _model(tmp_path, "target", width=32), _model(tmp_path, "draft")
  cases = [
      # The draft's checkpoint given for the target: the first parameter of another shape.
      ((target[0], draft[1]), draft, r"parameter '.*' has shape .* but the model config"),
      # A draft over another vocabulary.
      (target, _model(tmp_path, "other", vocab=9000, save=False), "vocab_size differ"),
      # A model smaller than the vocabulary.
      (_model(tmp_path, "small", vocab=4000, save=False),
       _model(tmp_path, "small_draft", vocab=4000, save=False), "vocab_size 4000 is smaller"),
  ]
  for t, d, message in cases:
    gin.clear_config()
    with pytest.raises(ValueError, match=message) as err:
      run(_args(tmp_path, t, d))
    own = [l for l in str(err.value).splitlines() if l.strip() and "In call to" not in l]
    assert len(own) == 1, own  # one line of its own (gin's call note aside)


def test_shipped_gemma_files_are_the_published_sizes():
  for name, config in GEMMA_SIZES.items():
    assert gin_config.model_config_from_file(os.path.join("models", f"{name}.gin")) == config
