"""Tests for specjax.distill: the KL term against numpy, a distilled draft ends closer
to its teacher than the same draft trained on the data alone, and a teacher that does
not fit the student is refused by name.

A tiny teacher is trained once (module fixture, through the CLI and runs/train_lm.gin);
two students of another size train for the same steps on the same batches, one with
runs/distill.gin layered on top.
"""
import os
import types

import jax
import numpy as np
import pytest

from specjax.train import distill
from specjax import train as T
from specjax.models import build_model, read_model_gin
from specjax.train import trainer as trainer_lib
from specjax.models.decoder_only import DecoderOnlyConfig
from specjax.models.t5 import T5Config
from tests.train.test_train import LM_GIN, run_cli

STUDENT_GIN = LM_GIN + """
DecoderOnlyConfig.emb_dim = 16
DecoderOnlyConfig.num_layers = 1
DecoderOnlyConfig.num_heads = 1
LEARNING_RATE = 0.05
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("distill")
  teacher_dir = str(tmp / "teacher")
  run_cli(LM_GIN, teacher_dir, str(tmp))
  plain = run_cli(STUDENT_GIN, str(tmp / "plain"), str(tmp))
  distilled = run_cli(STUDENT_GIN + f"""
include 'runs/distill.gin'
TEACHER = '{teacher_dir}'
""", str(tmp / "distilled"), str(tmp))
  # Both students' KL to the teacher on the same validation batches.
  r = distilled
  teacher, teacher_params = distill.load_teacher(distill.DistillConfig(teacher=teacher_dir),
                                                 r.model_config)
  trainer = T.get_trainer(r.model_config, r.optimizer, r.config.num_steps, r.config.z_loss,
                          teacher)
  trainer.teacher_params = teacher_params
  _, val = T.make_batches(r.data, r.model_config)
  kl = lambda params: trainer.evaluate(params, val.eval_batches(r.config.eval_batches))
  init = trainer.model.init(jax.random.PRNGKey(r.config.seed))
  return types.SimpleNamespace(tmp=tmp, teacher_dir=teacher_dir, plain=plain,
                               distilled=distilled, kl_init=kl(init), kl_plain=kl(plain.params),
                               kl_distilled=kl(distilled.params))


def test_kl_sum_matches_numpy():
  rng = np.random.default_rng(0)
  student = rng.normal(size=(2, 3, 7)).astype(np.float32) * 2
  teacher = rng.normal(size=(2, 3, 7)).astype(np.float32) * 2
  weights = np.array([[1, 1, 0], [1, 0, 1]], np.float32)
  for tau in (1.0, 2.0):
    p = np.exp(teacher / tau) / np.exp(teacher / tau).sum(-1, keepdims=True)
    q = np.exp(student / tau) / np.exp(student / tau).sum(-1, keepdims=True)
    want = np.sum(weights * np.sum(p * (np.log(p) - np.log(q)), -1))
    got = float(distill.divergence_sums(student, teacher, weights, tau)["kl_sum"])
    assert got == pytest.approx(want, rel=1e-5)
  same = float(distill.divergence_sums(teacher, teacher, weights)["kl_sum"])
  assert abs(same) < 1e-5


def test_tv_and_jsd_sums_match_numpy():
  rng = np.random.default_rng(1)
  student = rng.normal(size=(2, 3, 7)).astype(np.float32) * 2
  teacher = rng.normal(size=(2, 3, 7)).astype(np.float32) * 2
  weights = np.array([[1, 1, 0], [1, 0, 1]], np.float32)
  p = np.exp(teacher) / np.exp(teacher).sum(-1, keepdims=True)
  q = np.exp(student) / np.exp(student).sum(-1, keepdims=True)
  m = (p + q) / 2
  tv = np.sum(weights * 0.5 * np.abs(p - q).sum(-1))
  jsd = np.sum(weights * 0.5 * ((p * np.log(p / m)).sum(-1) + (q * np.log(q / m)).sum(-1)))
  got_tv = distill.divergence_sums(student, teacher, weights, 1.0, "tv")
  got_jsd = distill.divergence_sums(student, teacher, weights, 1.0, "jsd")
  assert float(got_tv["div_sum"]) == pytest.approx(tv, rel=1e-5)
  assert float(got_tv["tv_sum"]) == pytest.approx(tv, rel=1e-5)
  assert float(got_jsd["div_sum"]) == pytest.approx(jsd, rel=1e-5)
  agree = np.sum(weights * (p.argmax(-1) == q.argmax(-1)))
  assert float(got_tv["agree_sum"]) == agree
  # Every choice logs the same KL and TV.
  assert float(got_jsd["kl_sum"]) == pytest.approx(float(got_tv["kl_sum"]), rel=1e-6)
  with pytest.raises(ValueError, match="divergence"):
    distill.DistillConfig(teacher="/tmp/x", divergence="l2")


def test_mixed_loss_weights():
  t = distill.Teacher(model=None, weight=0.25, temperature=2.0)
  assert float(distill.mixed_loss(8.0, 3.0, t)) == pytest.approx(0.75 * 8.0 + 0.25 * 4 * 3.0)
  tv = distill.Teacher(model=None, weight=0.25, temperature=2.0, divergence="tv")
  assert float(distill.mixed_loss(8.0, 3.0, tv)) == pytest.approx(0.75 * 8.0 + 0.25 * 3.0)


def test_distilled_student_is_closer_to_teacher(runs):
  r = runs.distilled
  assert r.step == 20 and r.config.num_steps == 20
  assert all(np.isfinite(h["teacher_kl"]) for h in r.history)
  assert r.evals[-1]["teacher_kl"] == pytest.approx(runs.kl_distilled["teacher_kl"], rel=1e-5)
  # Distillation lowers the KL it optimizes well below the start, and below a student
  # trained for the same steps on the same batches with the data's labels only.
  assert runs.kl_distilled["teacher_kl"] < 0.5 * runs.kl_init["teacher_kl"]
  assert runs.kl_distilled["teacher_kl"] < 0.9 * runs.kl_plain["teacher_kl"], (
      runs.kl_distilled, runs.kl_plain)
  assert "teacher_kl" not in runs.plain.history[-1]


def test_teacher_must_fit_the_student(runs, tmp_path):
  cfg = runs.distilled.model_config
  other_vocab = DecoderOnlyConfig(**{**cfg.__dict__, "vocab_size": cfg.vocab_size + 1})
  with pytest.raises(ValueError, match="vocabulary"):
    distill.load_teacher(distill.DistillConfig(teacher=runs.teacher_dir), other_vocab)
  t5 = T5Config(vocab_size=cfg.vocab_size, emb_dim=16, num_heads=1, num_encoder_layers=1,
                num_decoder_layers=1, head_dim=16, mlp_dim=32)
  with pytest.raises(ValueError, match="one family"):
    distill.load_teacher(distill.DistillConfig(teacher=runs.teacher_dir), t5)
  with pytest.raises(FileNotFoundError, match="model.gin"):
    distill.load_teacher(distill.DistillConfig(teacher=str(tmp_path)), cfg)
  with pytest.raises(ValueError, match="weight"):
    distill.DistillConfig(teacher=runs.teacher_dir, weight=1.5)


def test_trainer_without_teacher_params_says_so(runs):
  r = runs.distilled
  teacher, _ = distill.load_teacher(distill.DistillConfig(teacher=runs.teacher_dir),
                                    r.model_config)
  trainer = T.Trainer(build_model(r.model_config), r.optimizer, 5, teacher=teacher)
  state = trainer.init_state(trainer.model.init(0))
  batch = T.make_batches(r.data, r.model_config)[0].batch(0)
  with pytest.raises(ValueError, match="teacher_params"):
    trainer.train_step(state, batch)
  assert os.path.isfile(os.path.join(runs.teacher_dir, "model.gin"))


def test_init_from_loads_the_folder_and_refuses_another_model(runs, tmp_path):
  cfg = runs.plain.model_config  # the student's config; the teacher's differs
  teacher_cfg = read_model_gin(runs.teacher_dir)
  model = build_model(teacher_cfg)
  got = trainer_lib.initial_params(model, teacher_cfg, T.TrainConfig(
      model_dir=str(tmp_path / "m"), num_steps=1, init_from=runs.teacher_dir))
  _, want = distill.load_teacher(distill.DistillConfig(teacher=runs.teacher_dir), teacher_cfg)
  jax.tree.map(np.testing.assert_array_equal, got, want)
  with pytest.raises(ValueError, match="different model"):
    trainer_lib.initial_params(build_model(cfg), cfg, T.TrainConfig(
        model_dir=str(tmp_path / "m"), num_steps=1, init_from=runs.teacher_dir))
  with pytest.raises(FileNotFoundError, match="model.gin"):
    trainer_lib.initial_params(model, teacher_cfg, T.TrainConfig(
        model_dir=str(tmp_path / "m"), num_steps=1, init_from=str(tmp_path)))


def test_teacher_data_is_the_teachers_text_whatever_the_chunking(runs, tmp_path):
  from specjax.data import load_vocab
  from specjax.data import splits as data_lib
  from specjax.decode import DecodeConfig, autoregressive_decode
  from specjax.sampling import Sampling
  from specjax.train import teacher_data
  docs = ["The package provides a library for parsing configuration files.",
          "This is a transitional dummy package.", "Tools for the command line.",
          "Documentation for the server.", "A small game with colourful puzzles."]
  data_lib.write_split(tmp_path / "data" / "lm_ddtp_en" / "train.txt", [(d, None) for d in docs])
  data_lib.write_split(tmp_path / "data" / "lm_ddtp_en" / "validation.txt", [(docs[0], None)])
  kw = dict(limit=5, batch=2, temperature=1.0, seed=3, max_new_tokens=6, prompt_tokens=3)
  a = teacher_data.write_teacher_split(runs.teacher_dir, "lm", str(tmp_path / "data"),
                                       str(tmp_path / "a"), chunk=2, **kw)
  b = teacher_data.write_teacher_split(runs.teacher_dir, "lm", str(tmp_path / "data"),
                                       str(tmp_path / "b"), chunk=5, **kw)
  assert a.read_text() == b.read_text()  # keys are tied to the example, not the chunk
  lines = a.read_text().splitlines()
  assert len(lines) == 5
  vocab = load_vocab()
  for doc, line in zip(docs, lines):  # each document keeps its 3-token prompt
    assert line.startswith(vocab.decode(vocab.encode(doc)[:3]).strip())
  # ... and goes on with the teacher's own draw: example 0 decoded alone, with its key.
  model, params = teacher_data.load_folder_model(runs.teacher_dir)
  prompt = np.asarray([vocab.encode(docs[0])[:3]], np.int32)
  config = DecodeConfig(sampling=Sampling(temperature=1.0), eos_id=vocab.eos_id, cache_len=11)
  alone = autoregressive_decode(model, params, prompt, max_new_tokens=6, config=config,
                                rng=jax.random.fold_in(jax.random.PRNGKey(3), 0)[None])
  expected = " ".join(vocab.decode(list(prompt[0]) + [int(t) for t in alone.tokens[0]]).split())
  assert lines[0] == expected
  assert (tmp_path / "a" / "lm_ddtp_en" / "validation.txt").read_text() == docs[0] + "\n"
  # Resume: a lost chunk is decoded again, to the same text.
  (tmp_path / "a" / "lm_ddtp_en" / ".parts" / "part_00000002.txt").unlink()
  again = teacher_data.write_teacher_split(runs.teacher_dir, "lm", str(tmp_path / "data"),
                                           str(tmp_path / "a"), chunk=2, **kw)
  assert again.read_text() == b.read_text()
  with pytest.raises(ValueError, match="other family"):
    teacher_data.write_teacher_split(runs.teacher_dir, "translate", str(tmp_path / "data"),
                                     str(tmp_path / "c"))
