"""teacher_data against stale chunks and its own inputs (docs/results/hostile_probe.md, second
part): chunks are reused only under the same manifest (teacher weights, sampling, limit,
sources), and an --out that would write over the --data_dir's split files is refused before
the teacher is even loaded. Two tiny random teachers (nothing trained), one compile shape."""
import json

import jax
import numpy as np
import pytest

from specjax import checkpoints
from specjax.data import load_vocab, splits
from specjax.models import build_model, model_gin_text
from specjax.testing import TINY_CONFIGS
from specjax.train import teacher_data

TINY = TINY_CONFIGS["lm"][0]  # the tiny LM target of specjax.testing
DOCS = [f"The package number {i} provides tools for the command line." for i in range(40)]
KW = dict(batch=8, max_new_tokens=4, prompt_tokens=3)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  """Two teacher folders (random weights, seeds 0 and 1) and a data folder of 40 documents."""
  root = tmp_path_factory.mktemp("teacher_data")
  model = build_model(TINY)
  teachers = []
  for seed in (0, 1):
    folder = root / f"teacher{seed}"
    checkpoints.save_t5x(model.init(jax.random.PRNGKey(seed)), str(folder), step=1,
                         dtype="float32")
    (folder / "model.gin").write_text(model_gin_text(TINY))
    teachers.append(str(folder))
  data = root / "data"
  splits.write_split(data / "lm_ddtp_en" / "train.txt", [(d, None) for d in DOCS])
  splits.write_split(data / "lm_ddtp_en" / "validation.txt", [(DOCS[0], None)])
  return root, teachers, str(data)


def test_a_larger_limit_is_not_served_the_smaller_runs_chunks(setup, tmp_path):
  # Chunks were keyed by their start index only: --limit 40 after --limit 10 ended with 10 rows.
  _, (teacher, _), data = setup
  out = str(tmp_path / "out")
  small = teacher_data.write_teacher_split(teacher, "lm", data, out, limit=10, **KW)
  assert len(small.read_text().splitlines()) == 10
  large = teacher_data.write_teacher_split(teacher, "lm", data, out, limit=40, **KW)
  assert len(large.read_text().splitlines()) == 40
  fresh = teacher_data.write_teacher_split(teacher, "lm", data, str(tmp_path / "fresh"),
                                           limit=40, **KW)
  assert large.read_text() == fresh.read_text()


def test_another_teacher_and_sampling_into_the_same_out_is_decoded_again(setup, tmp_path,
                                                                         caplog):
  # Another teacher at another temperature and seed used to get a byte-identical copy.
  _, (first, second), data = setup
  out = str(tmp_path / "out")
  a = teacher_data.write_teacher_split(first, "lm", data, out, limit=10, **KW).read_text()
  b = teacher_data.write_teacher_split(second, "lm", data, out, limit=10, temperature=1.0,
                                       seed=7, **KW).read_text()
  assert "discarding chunks of another run (it differs in seed, teacher_params_sha256, " \
         "temperature)" in caplog.text
  assert b != a
  alone = teacher_data.write_teacher_split(second, "lm", data, str(tmp_path / "alone"),
                                           limit=10, temperature=1.0, seed=7, **KW)
  assert b == alone.read_text()


def test_an_out_that_is_the_data_dir_is_refused_before_any_work(setup):
  # --out == --data_dir replaced the 800-document train.txt by 10 rows, then a SameFileError.
  root, _, data = setup
  before = (root / "data" / "lm_ddtp_en" / "train.txt").read_bytes()
  missing_teacher = str(root / "no_such_teacher")  # refused before the teacher is looked for
  with pytest.raises(ValueError, match="--out would write .*lm_ddtp_en, the folder of the "
                     "input split files"):
    teacher_data.main(["--teacher", missing_teacher, "--task", "lm", "--data_dir", data,
                       "--out", data, "--limit", "10"])
  assert (root / "data" / "lm_ddtp_en" / "train.txt").read_bytes() == before


def test_an_out_whose_split_file_is_an_input_is_refused(setup, tmp_path):
  root, (teacher, _), data = setup
  out = tmp_path / "out" / "lm_ddtp_en"
  out.mkdir(parents=True)
  (out / "validation.txt").symlink_to(root / "data" / "lm_ddtp_en" / "validation.txt")
  with pytest.raises(ValueError, match="validation.txt, which is the input"):
    teacher_data.write_teacher_split(teacher, "lm", data, str(tmp_path / "out"), limit=10, **KW)


def test_past_eos_writes_each_document_the_teacher_wrote_after_its_eos():
  vocab = load_vocab()
  eos = vocab.eos_id
  tokens = np.array([[7, eos, 8, 9, eos, eos, 10]], np.int32)  # a decode with EOS ignored
  clean = lambda ids: " ".join(vocab.decode(ids).split())
  rows = teacher_data._texts("lm", ["doc"], [[5, 6]], tokens, vocab, past_eos=True)  # pylint: disable=protected-access
  # One document per EOS-separated piece, in order; the empty one between two EOS dropped.
  assert rows == [(clean([5, 6, 7]), None), (clean([8, 9]), None), (clean([10]), None)]
  assert teacher_data._texts("lm", ["doc"], [[5, 6]], tokens, vocab) == [  # pylint: disable=protected-access
      (clean([5, 6, 7]), None)]  # without it: up to the first EOS


def test_past_eos_decodes_again_and_is_refused_for_a_seq2seq_task(setup, tmp_path):
  _, teachers, data = setup
  out = tmp_path / "kd"
  teacher_data.write_teacher_split(teachers[0], "lm", data, str(out), **KW)
  manifest = out / "lm_ddtp_en" / ".parts" / "manifest.json"
  assert "past_eos" not in json.loads(manifest.read_text())
  teacher_data.write_teacher_split(teachers[0], "lm", data, str(out), past_eos=True, **KW)
  assert json.loads(manifest.read_text())["past_eos"] is True  # the old chunks not reused
  with pytest.raises(ValueError, match="--past_eos is for the lm task"):
    teacher_data.write_teacher_split(teachers[0], "translate", data, str(out), past_eos=True,
                                     **KW)
