"""Gin-configured optax training of specjax's T5 and decoder-only models.

    python -m specjax.train --gin_file=runs/train_lm.gin --gin.MODEL_DIR="'/tmp/lm'"
    python -m specjax.train --gin_file=runs/train_translate.gin \\
        --gin.MODEL_DIR="'/tmp/t5'" --gin.DATA_DIR="'data/'" --gin.NUM_STEPS=2000

A run trains `train.model_config` (a `DecoderOnlyConfig` for task 'lm', a
`T5Config` for 'translate' / 'summarize'; see `specjax._train_data` for the
batches) with a jitted step: cross-entropy over non-padding targets plus
T5X's optional z-loss, global-norm gradient clipping, then adamw or adafactor
under linear warmup and cosine / rsqrt decay. Parameters stay float32.

Files in `TrainConfig.model_dir`:
  model.gin                the model config's bindings, so it travels with the weights
                           (a resumed run with a different config is refused); written
                           once the run is accepted, never replaced
  checkpoint_N/            T5X legacy checkpoints (`specjax.checkpoints.save_t5x`),
                           float32 every `checkpoint_every` steps, the last
                           `keep_checkpoints` kept; the final one in `final_dtype`
  checkpoint_N/optimizer_state.npz   the optax state of a float32 checkpoint
                           (numpy arrays, never pickled; T5X readers ignore it)
  checkpoint_N/train_state.json      the step and the run's resume fingerprint
  metrics.jsonl            one JSON line per log point and per evaluation

A checkpoint's params, optimizer state and train_state.json are committed by
one atomic rename (`specjax.checkpoints.save_t5x` with `extra_files`): a run
killed at any point leaves the previous checkpoint or the new one, never a part
of one.

Distillation (`specjax.distill`): with `train.distill = @DistillConfig()` the
loss mixes the data's cross-entropy with KL(teacher ‖ student), the teacher (a
trained model folder) evaluated in the same jitted step; `teacher_kl` is logged.

Resuming: when `model_dir` holds a checkpoint, the newest one with its
optimizer state is loaded and the step count restarts from its step; lines of
metrics.jsonl past that step are dropped. Batches depend only on (seed, step),
so the run continues exactly as the uninterrupted run would have, bit for bit.
A run whose data, optimizer, schedule, z-loss or teacher differ from what the
checkpoint recorded is refused (it could not continue that run exactly) unless
`--gin.ALLOW_CHANGED_TRAINING=True` (`TrainConfig.allow_changed_training`); a
different model is always refused, and a refused run changes nothing in
model_dir. Only when no checkpoint has an optimizer state (a bfloat16 export,
or a T5X checkpoint copied into an empty model_dir to fine-tune) are the
newest params used with a fresh optimizer state, and a warning says so.

A decode run reads the trained model back with `TARGET_MODEL = 'MODEL_DIR/model.gin'`
(or DRAFT_MODEL) and the checkpoint path.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import os
import time
from typing import Any, Callable, Dict, Iterable, List, Optional

import flax
import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                           TimeRemainingColumn)

from specjax import checkpoints
from specjax import files
from specjax.checks import check_choice
from specjax.models import MODEL_GIN, build_model, model_gin_text
from specjax.train._checks import check_int, check_real
from specjax.train.batches import DataConfig, make_batches
from specjax.train.checkpoints import (OPT_STATE_FILE, TRAIN_STATE_FILE, check_model_gin,
                                       list_checkpoints, load_opt_state, read_trained_folder,
                                       restore,
                                       resume_fingerprint, save_checkpoint, save_opt_state)
from specjax.train.distill import (DistillConfig, Teacher, divergence_sums, load_teacher,
                                   logits_fn, mixed_loss)

__all__ = [
    "OptimizerConfig", "DataConfig", "TrainConfig", "TrainState", "TrainResult", "Trainer",
    "make_schedule", "make_optimizer", "cross_entropy", "summarize",
    "get_trainer", "make_batches", "train", "save_checkpoint", "restore",
    "list_checkpoints", "save_opt_state", "load_opt_state", "model_gin_text",
    "check_model_gin", "MODEL_GIN", "OPT_STATE_FILE", "TRAIN_STATE_FILE", "METRICS_FILE",
    "DistillConfig", "resume_fingerprint",
]
log = logging.getLogger(__name__)
METRICS_FILE = "metrics.jsonl"
OTHER_LOOPS: Dict[type, Callable] = {}
"""Model config classes that another training loop trains, by class: `train` hands such a run
to it (`specjax.train.feature_head` registers `FeatureHeadConfig`)."""


# ----------------------------------------------------------------------------
# Configuration.
# ----------------------------------------------------------------------------
@gin.register(module="specjax.train")
@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """Optimizer, learning-rate schedule and gradient clipping."""
  name: str = "adamw"
  """'adamw' or 'adafactor' (optax's, T5X's defaults: factored moments, decay 0.8)."""
  learning_rate: float = 1e-3
  """Peak learning rate, reached at the end of the warmup."""
  warmup_steps: int = 100
  """Update s (1-based) uses learning_rate * s / warmup_steps while s <= warmup_steps."""
  decay: str = "cosine"
  """After warmup: 'cosine' (to end_learning_rate at the last step), 'rsqrt'
  (learning_rate * sqrt(warmup_steps / s), T5X's) or 'constant'."""
  end_learning_rate: float = 0.0
  """Where the cosine decay ends."""
  b1: float = 0.9
  """adamw first-moment decay."""
  b2: float = 0.999
  """adamw second-moment decay."""
  eps: float = 1e-8
  """adamw epsilon."""
  weight_decay: float = 0.0
  """Decoupled weight decay on matrices (ndim >= 2) only, not on norm scales."""
  clip_norm: Optional[float] = 1.0
  """Clip the gradients' global norm to this; None turns clipping off."""

  def __post_init__(self):
    check_choice("OptimizerConfig.name", self.name, ("adamw", "adafactor"))
    check_choice("OptimizerConfig.decay", self.decay, ("cosine", "rsqrt", "constant"))
    check_real(self, "learning_rate", 0, low_open=True)
    check_int(self, "warmup_steps", 0)
    check_real(self, "end_learning_rate", 0)
    check_real(self, "b1", 0, 1)
    check_real(self, "b2", 0, 1)
    check_real(self, "eps", 0)
    check_real(self, "weight_decay", 0)
    check_real(self, "clip_norm", 0, low_open=True, allow_none=True)

@gin.register(module="specjax.train")
@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """The training loop."""
  model_dir: str
  """Checkpoints, model.gin and metrics go here; a checkpoint here is resumed."""
  num_steps: int
  """Total optimizer updates (a resumed run continues up to this step)."""
  eval_every: int = 0
  """Evaluate on the validation split every this many steps (and always at the end; a
  feature head's run only with eval_every > 0: its evaluation is a rollout of guesses,
  `FeatureHeadTraining.eval_guesses`)."""
  eval_batches: Optional[int] = None
  """Validation batches per evaluation; None: the whole split."""
  checkpoint_every: int = 1000
  """Write a float32 checkpoint every this many steps (and always at the end)."""
  keep_checkpoints: int = 2
  """Checkpoints kept in model_dir (the oldest are deleted)."""
  final_dtype: str = "float32"
  """dtype of the final checkpoint; 'bfloat16' halves an export, which has no
  optimizer state: a later resume prefers an older float32 checkpoint, and only
  from the export alone restarts the optimizer state from scratch."""
  z_loss: float = 1e-4
  """Coefficient of T5X's z-loss, z_loss * logsumexp(logits)**2; 0 turns it off."""
  log_every: int = 10
  """Steps per progress / metrics.jsonl update."""
  seed: int = 0
  """Seed of the parameter initialization."""
  progress: bool = True
  """Show a rich progress bar and evaluation lines."""
  allow_changed_training: bool = False
  """Resume a checkpoint even though the data, optimizer, schedule, z-loss or
  teacher changed (the run then no longer equals an uninterrupted one)."""
  init_from: Optional[str] = None
  """Start from these parameters instead of a random initialization: a model folder
  written by specjax.train (its latest checkpoint; a bundled pair's folder works) or
  one checkpoint_N in it, of the same model config. The optimizer state starts fresh
  at step 0. Only a run with no checkpoint in model_dir starts; a resume ignores it."""

  def __post_init__(self):
    if not self.model_dir or not isinstance(self.model_dir, (str, os.PathLike)):
      raise ValueError(f"TrainConfig.model_dir must be a directory path, got {self.model_dir!r}")
    for field in ("num_steps", "checkpoint_every", "log_every", "keep_checkpoints"):
      check_int(self, field, 1)
    check_int(self, "eval_every", 0)
    check_int(self, "eval_batches", 1, allow_none=True)  # 0 failed only after the last step
    check_int(self, "seed", 0)
    check_real(self, "z_loss", 0)
    check_choice("TrainConfig.final_dtype", self.final_dtype, ("float32", "bfloat16"))
    if self.init_from is not None and (not isinstance(self.init_from, (str, os.PathLike))
                                       or not os.fspath(self.init_from)):
      raise ValueError(f"TrainConfig.init_from must be a model folder path or None, "
                       f"got {self.init_from!r}")


# ----------------------------------------------------------------------------
# Optimizer and loss.
# ----------------------------------------------------------------------------
def make_schedule(cfg: OptimizerConfig, num_steps: int) -> Callable[[Any], jax.Array]:
  """Learning rate as a function of the number of updates already applied (optax's count)."""
  lr, warm = cfg.learning_rate, cfg.warmup_steps

  def schedule(count):
    s = jnp.asarray(count, jnp.float32) + 1.0  # this update, 1-based
    warmup = lr * s / max(warm, 1)
    if cfg.decay == "cosine":
      frac = jnp.clip((s - warm) / max(num_steps - warm, 1), 0.0, 1.0)
      after = cfg.end_learning_rate + (lr - cfg.end_learning_rate) * 0.5 * (
          1.0 + jnp.cos(jnp.pi * frac))
    elif cfg.decay == "rsqrt":
      after = lr * jnp.sqrt(max(warm, 1) / jnp.maximum(s, 1.0))
    else:
      after = jnp.asarray(lr, jnp.float32)
    return jnp.where(s <= warm, warmup, after)

  return schedule


def _decay_mask(params: Any) -> Any:
  return jax.tree.map(lambda p: p.ndim >= 2, params)


def make_optimizer(cfg: OptimizerConfig, num_steps: int) -> optax.GradientTransformation:
  """Clipping then adamw / adafactor under `make_schedule(cfg, num_steps)`."""
  schedule = make_schedule(cfg, num_steps)
  if cfg.name == "adamw":
    opt = optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                      weight_decay=cfg.weight_decay, mask=_decay_mask)
  else:
    opt = optax.adafactor(schedule, weight_decay_rate=cfg.weight_decay or None,
                          weight_decay_mask=_decay_mask)
  if cfg.clip_norm is None:
    return opt
  return optax.chain(optax.clip_by_global_norm(cfg.clip_norm), opt)


def cross_entropy(logits: jax.Array, targets: jax.Array, weights: jax.Array,
                  z_loss: float = 0.0) -> Dict[str, jax.Array]:
  """Weighted sums of the per-token loss terms (T5X's cross_entropy_with_logits).

  Args:
    logits: float [B, L, V].
    targets: int32 [B, L].
    weights: float32 [B, L], 0 on padding.
    z_loss: coefficient of z_loss * logsumexp(logits)**2.

  Returns:
    float32 scalars: loss_sum (cross-entropy + z-loss), ce_sum, correct_sum
    (argmax == target) and weight_sum, all weighted by `weights`.
  """
  logits = logits.astype(jnp.float32)
  lse = jax.nn.logsumexp(logits, axis=-1)
  target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  ce = lse - target_logit
  correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
  return {"loss_sum": jnp.sum((ce + z_loss * jnp.square(lse)) * weights),
          "ce_sum": jnp.sum(ce * weights), "correct_sum": jnp.sum(correct * weights),
          "weight_sum": jnp.sum(weights)}


def summarize(sums: Dict[str, Any]) -> Dict[str, float]:
  """Means of `cross_entropy` sums: loss, cross_entropy, perplexity, accuracy, tokens
  (and teacher_kl / teacher_tv, the mean KL(teacher ‖ model) and total variation, when
  distilling: 1 − teacher_tv is the mean acceptance probability at T = 1 on that text)."""
  n = max(float(sums["weight_sum"]), 1.0)
  ce = float(sums["ce_sum"]) / n
  out = {"loss": float(sums["loss_sum"]) / n, "cross_entropy": ce,
         "perplexity": math.exp(min(ce, 700.0)), "accuracy": float(sums["correct_sum"]) / n,
         "tokens": float(sums["weight_sum"])}
  if "kl_sum" in sums:
    out["teacher_kl"] = float(sums["kl_sum"]) / n
  if "tv_sum" in sums:
    out["teacher_tv"] = float(sums["tv_sum"]) / n
  if "agree_sum" in sums:
    out["teacher_agree"] = float(sums["agree_sum"]) / n
  return out


@flax.struct.dataclass
class TrainState:
  """What one training step updates."""
  step: jax.Array  # int32 []: optimizer updates applied so far
  params: Any  # float32 parameter tree with T5X names
  opt_state: Any  # optax state of `params`


class Trainer:
  """A model, its optimizer and the jitted train / eval steps.

  Example:
    trainer = Trainer(model, OptimizerConfig(learning_rate=1e-2), num_steps=100)
    state = trainer.init_state(model.init(0))
    state, sums = trainer.train_step(state, batch)
    metrics = trainer.evaluate(state.params, batches.eval_batches())

  With a `teacher` (`specjax.distill`), set `trainer.teacher_params` before
  stepping: the loss then mixes in KL(teacher ‖ model).
  """

  def __init__(self, model: Any, optimizer: OptimizerConfig, num_steps: int,
               z_loss: float = 1e-4, teacher: Optional[Teacher] = None):
    self.model = model
    self.teacher = teacher
    self.teacher_params = None
    self.schedule = make_schedule(optimizer, num_steps)
    self.optimizer = make_optimizer(optimizer, num_steps)
    student_logits = logits_fn(model)
    teacher_logits = logits_fn(teacher.model) if teacher is not None else None

    def sums_fn(params, batch, z, teacher_params):
      logits = student_logits(params, batch)
      sums = cross_entropy(logits, batch["decoder_target_tokens"],
                           batch["decoder_loss_weights"], z)
      if teacher is not None:
        sums.update(divergence_sums(logits, teacher_logits(teacher_params, batch),
                                    batch["decoder_loss_weights"], teacher.temperature,
                                    teacher.divergence))
      return sums

    def loss_fn(params, batch, teacher_params):
      sums = sums_fn(params, batch, z_loss, teacher_params)
      total = (sums["loss_sum"] if teacher is None
               else mixed_loss(sums["loss_sum"], sums["div_sum"], teacher))
      return total / jnp.maximum(sums["weight_sum"], 1.0), sums

    def step_fn(state: TrainState, batch, teacher_params):
      (_, sums), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch,
                                                                   teacher_params)
      updates, opt_state = self.optimizer.update(grads, state.opt_state, state.params)
      params = optax.apply_updates(state.params, updates)
      sums = dict(sums, grad_norm=optax.tree.norm(grads))
      return TrainState(step=state.step + 1, params=params, opt_state=opt_state), sums

    self._train_step = jax.jit(step_fn, donate_argnums=0)
    self.learning_rate = jax.jit(self.schedule)
    self._eval_step = jax.jit(lambda p, b, t: sums_fn(p, b, z_loss, t))
    self._opt_init = jax.jit(self.optimizer.init)
    self._finite = jax.jit(lambda tree: jnp.all(jnp.asarray(
        [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)])))

  def params_finite(self, params: Any) -> bool:
    """True when no parameter holds NaN or inf (one jitted pass)."""
    return bool(self._finite(params))

  def _teacher_args(self) -> Any:
    if self.teacher is not None and self.teacher_params is None:
      raise ValueError("this Trainer distills from a teacher: set trainer.teacher_params "
                       "(specjax.distill.load_teacher) first")
    return self.teacher_params

  def train_step(self, state: TrainState, batch: Dict[str, Any]):
    """One update (jitted; `state` is donated) -> (state, loss sums of the batch)."""
    return self._train_step(state, batch, self._teacher_args())

  def precompile(self, state: TrainState, shapes: Iterable[Dict[str, Any]]) -> None:
    """Compiles the train step for each batch shape, e.g. `Batches.batch_shapes()`."""
    for feats in shapes:
      batch = {k: jax.ShapeDtypeStruct(shape, dtype) for k, (shape, dtype) in feats.items()}
      self._train_step.lower(state, batch, self._teacher_args()).compile()

  def init_state(self, params: Any, step: int = 0, opt_state: Any = None) -> TrainState:
    """A state at `step` with `params` (cast to float32) and a fresh or given optax state."""
    params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)
    if opt_state is None:
      opt_state = self._opt_init(params)
    return TrainState(step=jnp.asarray(step, jnp.int32), params=params, opt_state=opt_state)

  def evaluate(self, params: Any, batches: Iterable[Dict[str, np.ndarray]]) -> Dict[str, float]:
    """`summarize`d loss, perplexity and accuracy of `params` over `batches`."""
    teacher = self._teacher_args()
    parts = [self._eval_step(params, batch, teacher) for batch in batches]
    if not parts:
      raise ValueError("evaluate needs at least one batch")
    parts = jax.device_get(parts)
    return summarize({k: sum(float(p[k]) for p in parts) for k in parts[0]})


@functools.lru_cache(maxsize=8)
def get_trainer(model_config: Any, optimizer: OptimizerConfig, num_steps: int,
                z_loss: float = 1e-4, teacher: Optional[Teacher] = None) -> Trainer:
  """A Trainer of `build_model(model_config)`, cached: repeated runs reuse its compiled steps."""
  return Trainer(build_model(model_config), optimizer, num_steps, z_loss, teacher)


# ----------------------------------------------------------------------------
# The loop.
# ----------------------------------------------------------------------------
@dataclasses.dataclass
class TrainResult:
  """What `train` returns."""
  step: int
  """Step of the final params."""
  start_step: int
  """Step the run started from (a resumed checkpoint's, or 0)."""
  params: Any
  """Final float32 parameters (numpy, T5X names)."""
  history: List[Dict[str, float]]
  """Training metrics per log point (step, loss, cross_entropy, accuracy, learning_rate, ...)."""
  evals: List[Dict[str, float]]
  """Validation metrics per evaluation (step, loss, cross_entropy, perplexity, accuracy)."""
  tokens_per_second: float
  """Non-padding target tokens per second of training, compilation, evaluation and
  checkpointing excluded (nan for a run of one step)."""
  checkpoint: Optional[str]
  """The final checkpoint folder (None when nothing was left to train)."""
  model_config: Any = None
  """The model config trained."""
  data: Optional[DataConfig] = None
  """The data config used (gin-resolved)."""
  optimizer: Optional[OptimizerConfig] = None
  """The optimizer config used (gin-resolved)."""
  config: Optional[TrainConfig] = None
  """The loop config used (gin-resolved)."""


def _truncate_metrics(model_dir: str, step: int) -> None:
  """Drops metrics.jsonl lines past `step` (and a torn last line) before a resumed run."""
  path = os.path.join(model_dir, METRICS_FILE)
  if not os.path.isfile(path):
    return
  with open(path, "rb") as f:
    lines = f.read().splitlines(keepends=True)
  keep = []
  for line in lines:
    try:
      record = json.loads(line)
    except ValueError:
      continue
    if (isinstance(record, dict) and isinstance(record.get("step"), int)
        and record["step"] <= step and line.endswith(b"\n")):
      keep.append(line)
  if len(keep) != len(lines):
    files.write_file(path, b"".join(keep))


def _append_metrics(model_dir: str, record: Dict[str, Any]) -> None:
  record = {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in record.items()}
  path = os.path.join(model_dir, METRICS_FILE)
  try:
    with open(path, "a", encoding="utf-8") as f:
      f.write(json.dumps(record) + "\n")
  except OSError as e:  # a full disk names no file
    raise OSError(e.errno, f"cannot write {path}: {e.strerror}") from e


def _diverged(model_dir: str, step: int, what: str) -> None:
  """Stops a diverged run before it writes a checkpoint (older ones stay: nothing lost)."""
  kept = list_checkpoints(model_dir)
  raise FloatingPointError(
      f"training diverged at step {step}: {what}. Nothing was saved past "
      + (f"checkpoint_{kept[-1]} (kept, with the older ones)" if kept else "the start")
      + "; lower the learning rate or turn on gradient clipping (OptimizerConfig.clip_norm), "
      "then resume")


@gin.register(module="specjax.train")
def train(model_config: Any = gin.REQUIRED, data: Optional[DataConfig] = None,
          optimizer: Optional[OptimizerConfig] = None,
          config: Optional[TrainConfig] = None,
          distill: Optional[DistillConfig] = None, feature: Any = None) -> TrainResult:
  """Trains (or resumes training) a model; see the module docstring.

  Args:
    model_config: a DecoderOnlyConfig (task 'lm') or T5Config ('translate', 'summarize').
    data: the data; None builds `DataConfig()` from gin bindings.
    optimizer: None builds `OptimizerConfig()` from gin bindings.
    config: the loop; None builds `TrainConfig()` from gin bindings.
    distill: a teacher to distill from (`specjax.distill`); None trains on the data alone.
    feature: `OTHER_LOOPS` only: a feature head's `FeatureHeadTraining` (None: from gin).

  Returns:
    A TrainResult.
  """
  for config_class, other in OTHER_LOOPS.items():
    if isinstance(model_config, config_class):
      return other(model_config, data, optimizer, config, feature)
  # gin.register leaves the classes untouched: their configured versions read the bindings.
  data = data if data is not None else gin.get_configurable(DataConfig)()
  optimizer = optimizer if optimizer is not None else gin.get_configurable(OptimizerConfig)()
  config = config if config is not None else gin.get_configurable(TrainConfig)()
  train_batches, eval_batches = make_batches(data, model_config)
  trainer, fingerprint, state = _start(model_config, data, optimizer, config, distill)
  start = int(state.step)
  # The run is accepted: only now is anything in model_dir written.
  check_model_gin(config.model_dir, model_config)
  _truncate_metrics(config.model_dir, start)
  result = TrainResult(step=start, start_step=start, params=None, history=[], evals=[],
                       tokens_per_second=float("nan"), checkpoint=None,
                       model_config=model_config, data=data, optimizer=optimizer, config=config)
  if start >= config.num_steps:
    log.warning("%s is at step %d >= num_steps %d: nothing to train", config.model_dir,
                start, config.num_steps)
    result.params = jax.device_get(state.params)
    return result
  shapes = train_batches.batch_shapes()
  if len(shapes) > 1:  # length buckets: compile them all before the clock starts
    trainer.precompile(state, shapes)

  columns = (TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
             TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[tps]} tok/s"),
             TimeRemainingColumn())
  pending, meter = [], _Throughput()
  with Progress(*columns, disable=not config.progress) as bar:
    task_id = bar.add_task("train", total=config.num_steps, completed=start, loss="-", tps="-")

    for step in range(start, config.num_steps):
      state, sums = trainer.train_step(state, train_batches.batch(step))
      pending.append(sums)
      done = step + 1
      if done == start + 1 or done % config.log_every == 0 or done == config.num_steps:
        window = jax.device_get(pending)
        tps = meter.window(sum(float(s["weight_sum"]) for s in window))
        total = {k: sum(float(s[k]) for s in window) for k in window[0]}
        record = dict(summarize(total), step=done, tokens_per_second=tps,
                      grad_norm=float(window[-1]["grad_norm"]),
                      learning_rate=float(trainer.learning_rate(done - 1)))
        result.history.append(record)
        _append_metrics(config.model_dir, dict(record, split="train"))
        if not math.isfinite(record["loss"]):
          _diverged(config.model_dir, done, f"the training loss is {record['loss']}")
        bar.update(task_id, completed=done, loss=f"{record['loss']:.3f}",
                   tps="-" if math.isnan(tps) else f"{tps:,.0f}")
        pending = []
      t0 = time.perf_counter()
      # Evaluate before the checkpoint: once checkpoint_N exists, metrics.jsonl
      # holds every line up to N (a resume from it truncates to N).
      if done == config.num_steps or (config.eval_every and done % config.eval_every == 0):
        result.evals.append(_evaluate(config, trainer, state, eval_batches, done, bar.console))
      saved = _checkpoint(config, trainer, state, done, fingerprint)
      result.checkpoint = saved if done == config.num_steps else result.checkpoint
      meter.paused += time.perf_counter() - t0
  result.step = int(state.step)
  result.params = jax.device_get(state.params)
  if meter.seconds > 0:
    result.tokens_per_second = meter.tokens / meter.seconds
  return result


def _evaluate(config: TrainConfig, trainer, state, eval_batches, step: int, console) -> Dict:
  """Validation metrics at `step`, appended to metrics.jsonl (and printed with progress)."""
  metrics = dict(trainer.evaluate(state.params, eval_batches.eval_batches(config.eval_batches)),
                 step=step)
  _append_metrics(config.model_dir, dict(metrics, split="validation"))
  if config.progress:
    console.print(f"step {step}: validation loss {metrics['loss']:.4f} "
                  f"perplexity {metrics['perplexity']:.2f} accuracy {metrics['accuracy']:.3f}")
  return metrics


def _checkpoint(config: TrainConfig, trainer, state, done: int, fingerprint) -> Optional[str]:
  """checkpoint_N at every checkpoint_every-th step (float32) and the last (final_dtype),
  after checking the parameters are finite; None at other steps."""
  last = done == config.num_steps
  if not (last or done % config.checkpoint_every == 0):
    return None
  if not trainer.params_finite(state.params):
    _diverged(config.model_dir, done, "the parameters hold NaN or inf")
  return save_checkpoint(config.model_dir, state, config.final_dtype if last else "float32",
                         config.keep_checkpoints, fingerprint)


class _Throughput:
  """Tokens per second over log windows, the first (compilation) and pauses (evaluation,
  checkpoints) left out."""

  def __init__(self):
    self.tokens, self.seconds, self.paused, self._last = 0.0, 0.0, 0.0, None

  def window(self, tokens: float) -> float:
    """Closes a window of `tokens`; its tokens per second (NaN for the first window)."""
    now = time.perf_counter()
    tps = float("nan")
    if self._last is not None:
      spent = now - self._last - self.paused
      self.tokens += tokens
      self.seconds += spent
      tps = tokens / max(spent, 1e-9)
    self._last, self.paused = now, 0.0
    return tps


def _start(model_config: Any, data: DataConfig, optimizer: OptimizerConfig,
           config: TrainConfig, distill: Optional[DistillConfig]):
  """The trainer, the run's resume fingerprint and its state: restored from model_dir's
  latest checkpoint when the run matches it, else initialized. Writes nothing yet."""
  if os.path.exists(config.model_dir) and not os.path.isdir(config.model_dir):
    raise ValueError(f"TrainConfig.model_dir {config.model_dir} is a file, not a folder")
  os.makedirs(config.model_dir, exist_ok=True)
  check_model_gin(config.model_dir, model_config, write=False)
  teacher, teacher_params = (load_teacher(distill, model_config) if distill is not None
                             else (None, None))
  trainer = get_trainer(model_config, optimizer, config.num_steps, config.z_loss, teacher)
  trainer.teacher_params = teacher_params
  fingerprint = resume_fingerprint(model_config, data, optimizer, config, distill)
  state = restore(config.model_dir, trainer, fingerprint, config.allow_changed_training)
  if state is None:
    state = trainer.init_state(initial_params(trainer.model, model_config, config))
  return trainer, fingerprint, state


def initial_params(model: Any, model_config: Any, config: TrainConfig) -> Any:
  """A random initialization (seed `config.seed`), or the float32 parameters of
  `config.init_from` after checking that folder's model.gin matches `model_config`."""
  if config.init_from is None:
    return model.init(jax.random.PRNGKey(config.seed))
  folder, theirs = read_trained_folder(config.init_from, "TrainConfig.init_from")
  if theirs != model_config:
    raise ValueError(f"TrainConfig.init_from {config.init_from} holds a different model: "
                     f"{theirs} vs the configured {model_config}")
  log.info("initializing from %s", config.init_from)
  return checkpoints.load_t5x_for_model(folder, model, dtype="float32")
