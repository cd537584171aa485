"""Draft distillation: train a small model toward a trained target's distributions.

Speculative decoding accepts a draft guess with probability Σ_x min(p, q) =
1 − TV(p, q) (the paper's α), so a draft is better the closer its q is to the
target's p, not to the data. Distillation trains the draft on

    loss = (1 − weight) · CE(data) + weight · τ² · KL(p_τ ‖ q_τ)

per non-padding target position, where p_τ and q_τ are the teacher's and the
student's softmax at temperature τ (Hinton et al.; τ² keeps the gradient scale),
and the teacher runs in the same jitted step on the same batch, its parameters
an argument of the step (not a compile-time constant).

`divergence` picks the term (DistillSpec, Zhou et al. 2024, compares them):
  'kl'   KL(p_τ ‖ q_τ), scaled by τ² (the default);
  'tv'   total variation ½ Σ_x |p_τ − q_τ|: 1 − TV is exactly the acceptance
         probability at that position, so this term maximizes α directly;
  'jsd'  Jensen–Shannon ½ KL(p ‖ m) + ½ KL(q ‖ m), m = (p + q) / 2.
Every step logs the mean KL, the mean TV and the argmax agreement (`teacher_kl`,
`teacher_tv`, `teacher_agree`) whichever term is trained: on teacher-forced text,
1 − teacher_tv is the acceptance rate α at T = 1 and teacher_agree the one at T = 0.

    python -m specjax.train --gin_file=runs/train_lm_draft.gin \\
        --gin_file=runs/distill.gin --gin.MODEL_DIR="'/tmp/lm_draft'" \\
        --gin.DATA_DIR="'data/'" --gin.TEACHER="'/tmp/lm_target'"
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Dict, Tuple

import gin
import jax
import jax.numpy as jnp

from specjax import checkpoints
from specjax.checks import check_choice

from specjax.models import build_model
from specjax.train.checkpoints import read_trained_folder
from specjax.train._checks import check_real


DIVERGENCES = ("kl", "tv", "jsd")


@gin.register(module="specjax.train")
@dataclasses.dataclass(frozen=True)
class DistillConfig:
  """Where the teacher is and how much of the loss it owns."""
  teacher: str
  """A trained model folder (model.gin + checkpoint_N/, as specjax.train writes;
  the latest checkpoint is used) or one checkpoint_N folder inside such a folder."""
  weight: float = 1.0
  """Share of the KL term; 1 − weight stays on the data's cross-entropy."""
  temperature: float = 1.0
  """τ of both softmaxes in the KL term (1 matches what speculative sampling compares)."""
  divergence: str = "kl"
  """The distillation term: 'kl' (forward KL), 'tv' (total variation) or 'jsd'."""

  def __post_init__(self):
    check_choice("DistillConfig.divergence", self.divergence, DIVERGENCES)
    if not isinstance(self.teacher, (str, os.PathLike)) or not os.fspath(self.teacher):
      raise ValueError(f"DistillConfig.teacher must be a model folder path, got {self.teacher!r}")
    check_real(self, "weight", 0, 1, high_open=False)
    check_real(self, "temperature", 0, low_open=True)


@dataclasses.dataclass(frozen=True)
class Teacher:
  """The static half of a teacher (hashable, so trainers that share it share compiles)."""
  model: Any
  """A specjax model (T5Model or DecoderOnlyModel)."""
  weight: float
  temperature: float
  divergence: str = "kl"


def load_teacher(config: DistillConfig, student_config: Any) -> Tuple[Teacher, Any]:
  """(Teacher, float32 params) from `config.teacher`; checks it fits the student.

  Raises ValueError when the teacher's family or vocabulary differs from the
  student's, FileNotFoundError when the folder holds no model.gin or checkpoint.
  """
  folder, teacher_config = read_trained_folder(config.teacher, "teacher")
  if type(teacher_config) is not type(student_config):
    raise ValueError(f"teacher is a {type(teacher_config).__name__} but the student is a "
                     f"{type(student_config).__name__}: distillation needs one family")
  if teacher_config.vocab_size != student_config.vocab_size:
    raise ValueError(f"teacher vocabulary {teacher_config.vocab_size} != student vocabulary "
                     f"{student_config.vocab_size}: draft and target must share one vocabulary")
  model = build_model(teacher_config)
  params = checkpoints.load_t5x_for_model(folder, model, dtype="float32")
  params = jax.tree.map(jnp.asarray, params)
  return Teacher(model, config.weight, config.temperature, config.divergence), params


def divergence_sums(student_logits: jax.Array, teacher_logits: jax.Array, weights: jax.Array,
                    temperature: float = 1.0, divergence: str = "kl") -> Dict[str, jax.Array]:
  """Weighted sums of per-position divergences between teacher p and student q.

  Args:
    student_logits: float [B, L, V].
    teacher_logits: float [B, L, V] (no gradient flows into them).
    weights: float32 [B, L], 0 on padding.
    temperature: τ of both softmaxes.
    divergence: the trained term, 'kl', 'tv' or 'jsd' (see the module docstring).
  Returns:
    float32 [] sums over positions of weights · D:
      'kl_sum'   KL(p_τ ‖ q_τ) in nats (not scaled by τ²),
      'tv_sum'   ½ Σ_x |p_τ − q_τ|,
      'agree_sum'  positions where the two argmaxes agree (greedy acceptance),
      'div_sum'  the `divergence` term (the same array as one of the above, or the JSD).
  """
  teacher_logits = jax.lax.stop_gradient(teacher_logits.astype(jnp.float32))
  log_p = jax.nn.log_softmax(teacher_logits / temperature, axis=-1)
  log_q = jax.nn.log_softmax(student_logits.astype(jnp.float32) / temperature, axis=-1)
  p, q = jnp.exp(log_p), jnp.exp(log_q)
  kl = jnp.sum(p * (log_p - log_q), axis=-1)  # [B, L]
  tv = 0.5 * jnp.sum(jnp.abs(p - q), axis=-1)  # [B, L]
  agree = (jnp.argmax(teacher_logits, -1) == jnp.argmax(student_logits, -1)).astype(jnp.float32)
  out = {"kl_sum": jnp.sum(kl * weights), "tv_sum": jnp.sum(tv * weights),
         "agree_sum": jnp.sum(agree * weights)}
  if divergence == "kl":
    out["div_sum"] = out["kl_sum"]
  elif divergence == "tv":
    out["div_sum"] = out["tv_sum"]
  elif divergence == "jsd":
    log_m = jnp.log(0.5 * (p + q) + 1e-30)
    jsd = 0.5 * (jnp.sum(p * (log_p - log_m), axis=-1) + jnp.sum(q * (log_q - log_m), axis=-1))
    out["div_sum"] = jnp.sum(jsd * weights)
  else:
    raise ValueError(f"divergence must be one of {DIVERGENCES}, got {divergence!r}")
  return out


def mixed_loss(ce_loss_sum: jax.Array, div_sum: jax.Array, teacher: Teacher) -> jax.Array:
  """(1 − w) · (CE + z-loss) + w · s · D, both sums over the same positions; s = τ² for
  KL (Hinton's gradient scale), 1 for TV and JSD."""
  scale = teacher.temperature ** 2 if teacher.divergence == "kl" else 1.0
  return (1.0 - teacher.weight) * ce_loss_sum + teacher.weight * scale * div_sum


def logits_fn(model: Any) -> Callable[[Any, Dict[str, jax.Array]], jax.Array]:
  """fn(params, batch) -> float [B, L, V]: teacher-forced logits of a training batch."""
  if model.is_encoder_decoder:
    return lambda p, b: model.logits(p, b["encoder_input_tokens"], b["decoder_input_tokens"])
  return lambda p, b: model.logits(p, b["decoder_input_tokens"])
