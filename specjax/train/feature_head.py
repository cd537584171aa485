"""Training a feature head (`specjax.models.FeatureHead`) from a frozen target's features.

    python -m specjax.train --gin_file=runs/train_lm_eagle.gin --gin.MODEL_DIR="'/tmp/eagle'"

`specjax.train.train` hands a run whose `train.model_config` is a `FeatureHeadConfig` to
`train_feature_head`. Each step runs the frozen target teacher-forced over the batch (its
features f and logits), the head over [f_{p-1}, embedding(x_p)], and minimizes, per
non-padding position,

  feature_weight * smooth_L1(predicted f_p - f_p)       (mean over E; EAGLE's regression)
  + token_weight * CE(target's distribution, head's)     (through the target's frozen
                                                          output projection)

With `passes` > 1 the head runs again over its own predicted features (pass k reads pass
k - 1's predictions, as a chain's later guesses do) and the loss is the mean over passes.
With `rollout_steps` K > 1 (EAGLE-3's training-time test, `specjax.train.rollout`) each step
trains K guesses per position instead, guess k weighted `rollout_decay ** k`; a head with
`feature_layers` reads the fusion of the target's hidden states at those layers.
Only the head's parameters change. The run writes token_ranking.npy beside model.gin (the
token ids by count among the data's target tokens, `load_token_ranking`): a
`FeatureDrafter` with `vocab_limit` K drafts over its first K. The batches are
`specjax.train.batches`' (`DataConfig`: the prepared corpus, or a folder written by
`specjax.train.teacher_data`). Checkpoints,
model.gin, metrics.jsonl and resuming are the trainer's (`specjax.train.trainer`): a run
killed at any point resumes from its newest checkpoint and continues exactly; the target
folder and the loss weights are part of the resume fingerprint. Logged: loss, cross_entropy,
feature_loss, accuracy (argmax agreement with the target, an α estimate at T = 0),
teacher_tv (1 - teacher_tv estimates α at T = 1) and with several passes fed_agreement.
With `TrainConfig.eval_every` > 0 the run also evaluates on the validation split (every
eval_every steps and at the end; `split: validation` lines in metrics.jsonl): a rollout of
`FeatureHeadTraining.eval_guesses` guesses per position, its agreement by guess and a chain
estimate of tokens per target call (`head_record`). `python -m specjax.app.head_eval`
evaluates saved heads and checkpoints so, side by side.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from typing import Any, Dict, Optional, Tuple

import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax

from specjax import checkpoints
from specjax.draft.ranking import RANKING_FILE, load_token_ranking, write_token_ranking
from specjax.models import FeatureHead, FeatureHeadConfig, build_model
from specjax.models.feature_head import shift_features
from specjax.train._checks import check_real
from specjax.train.rollout import (rollout_loss_sums, smooth_l1, target_features,
                                   warm_start_params)
from specjax.train.batches import DataConfig, make_batches
from specjax.train import trainer as base
from specjax.train.checkpoints import (check_model_gin, read_trained_folder, restore,
                                       resume_fingerprint, save_checkpoint)

log = logging.getLogger(__name__)


@gin.register(module="specjax.train")
@dataclasses.dataclass(frozen=True)
class FeatureHeadTraining:
  """What a feature head learns from, beside the trainer's configs."""
  target: str
  """The frozen target: a model folder written by specjax.train (its latest checkpoint), one
  checkpoint_N in it, or a shipped model such as 'bundled:lm/target'."""
  feature_weight: float = 1.0
  """Weight of the smooth-L1 feature regression."""
  token_weight: float = 0.1
  """Weight of the cross-entropy from the target's distribution to the head's."""
  passes: int = 1
  """Teacher-forced passes per step. Pass 1 reads the target's true features; pass k >= 2
  reads the features the head predicted in pass k - 1 (as a chain's later guesses read its
  own predictions), the gradient flowing through them. The loss is the mean over passes;
  the logged agreement and 1 - TV are pass 1's, `fed_agreement` the last pass's."""
  rollout_steps: int = 1
  """Training-time test (`specjax.train.rollout`, EAGLE-3): K guesses per position in one
  step, guess k reading the head's own guess k - 1 and the target's features only up to
  p - k, as in a chain. 1: teacher-forced only (with `passes`)."""
  rollout_decay: float = 0.8
  """Guess k's loss is weighted rollout_decay ** k (EAGLE-3's 0.8)."""
  vocab_limit: Optional[int] = None
  """With `passes` 1: the head's distribution over the run's first vocab_limit
  ranked token ids only (token_ranking.npy), as a drafter with that vocab_limit drafts; its
  logits cost vocab_limit / V of the full product. None: all ids."""
  warm_start: Optional[str] = None
  """A trained head's folder (e.g. 'bundled:lm/eagle' or its path) whose parameters of the
  same names and shapes start a fresh run; with `feature_layers` that include the final
  hidden state, the fusion starts as its selection (`specjax.train.rollout`). Ignored on
  resume."""

  eval_guesses: int = 4
  """Held-out evaluation (`TrainConfig.eval_every` > 0, `specjax.train.head_eval`) rolls out
  this many guesses per position, as a chain drafts, whatever `rollout_steps` and `passes`
  trained: heads trained either way compare by their validation agreement by guess."""

  def __post_init__(self):
    if not isinstance(self.target, (str, os.PathLike)) or not os.fspath(self.target):
      raise ValueError(f"FeatureHeadTraining.target must be a model folder, got {self.target!r}")
    check_real(self, "feature_weight", 0)
    check_real(self, "token_weight", 0)
    for field in ("passes", "rollout_steps", "eval_guesses"):
      value = getattr(self, field)
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"FeatureHeadTraining.{field} must be an int >= 1, got {value!r}")
    if self.passes > 1 and self.rollout_steps > 1:
      raise ValueError("FeatureHeadTraining: passes > 1 and rollout_steps > 1 both feed the "
                       "head its own predictions; choose one (rollout_steps is EAGLE-3's "
                       "training-time test)")
    check_real(self, "rollout_decay", 0, 1, low_open=True, high_open=False)
    if self.vocab_limit is not None and (not isinstance(self.vocab_limit, int)
                                         or isinstance(self.vocab_limit, bool)
                                         or self.vocab_limit < 1 or self.passes > 1):
      raise ValueError("FeatureHeadTraining.vocab_limit must be None or an int >= 1 with "
                       f"passes 1, got {self.vocab_limit!r} with passes {self.passes}")


def load_target(folder: Any) -> Tuple[Any, Any]:
  """(target model, float32 params) of a trained model folder; FileNotFoundError without its
  model.gin."""
  folder, config = read_trained_folder(folder, "feature head target")
  model = build_model(config)
  return model, checkpoints.load_t5x_for_model(folder, model, dtype="float32")


def load_head(folder: Any) -> Tuple[FeatureHead, Any]:
  """(FeatureHead, float32 params) of a folder written by `train_feature_head` (its latest
  checkpoint) or one checkpoint_N in it.

  Raises FileNotFoundError when the folder has no model.gin, ValueError when its model.gin
  describes no feature head."""
  folder, config = read_trained_folder(folder, "feature head")
  if not isinstance(config, FeatureHeadConfig):
    raise ValueError(f"feature head {folder}: its model.gin describes a "
                     f"{type(config).__name__}, not a FeatureHeadConfig")
  head = FeatureHead(config)
  return head, checkpoints.load_t5x_for_model(folder, head, dtype="float32")


def token_ranking(features: Dict[str, Any], vocab_size: int) -> np.ndarray:
  """Every token id, int32 [V], most frequent first among a training table's target tokens
  (`decoder_target_tokens` where `decoder_loss_weights` > 0; ties in id order): what a
  `FeatureDrafter` with `vocab_limit` K drafts over (its first K ids)."""
  tokens = np.asarray(features["decoder_target_tokens"])
  weights = np.asarray(features["decoder_loss_weights"]) > 0
  counts = np.bincount(tokens[weights].ravel(), minlength=vocab_size)[:vocab_size]
  return np.argsort(-counts, kind="stable").astype(np.int32)


def _write_token_ranking(model_dir: str, features: Dict[str, Any], vocab_size: int) -> None:
  """Writes token_ranking.npy once per run (`write_token_ranking`: a fresh temporary renamed
  into place; a link planted under its name is replaced, never followed)."""
  path = os.path.join(model_dir, RANKING_FILE)
  if os.path.isfile(path) and not os.path.islink(path):
    return
  write_token_ranking(model_dir, token_ranking(features, vocab_size))


def head_loss_sums(head: FeatureHead, target: Any, head_params: Any, target_params: Any,
                   batch: Dict[str, jax.Array], feature: FeatureHeadTraining,
                   ids: Optional[jax.Array] = None) -> Dict[str, jax.Array]:
  """Weighted sums over a batch's non-padding positions (float32 scalars): loss_sum (the
  mean over `feature.passes`), pass 1's ce_sum, feature_sum, correct_sum (argmax agreement
  with the target) and tv_sum (total variation to the target's distribution), weight_sum,
  and with several passes fed_correct_sum (the last pass's agreement). With
  `feature.rollout_steps` > 1 or a `vocab_limit` (over `ids` int32 [K]),
  `specjax.train.rollout.rollout_loss_sums`' (one step: the teacher-forced guess alone)."""
  if feature.rollout_steps > 1 or ids is not None:
    return rollout_loss_sums(head, target, head_params, target_params, batch,
                             feature.rollout_steps, feature.rollout_decay,
                             feature.feature_weight, feature.token_weight, ids)
  tokens = batch["decoder_input_tokens"]  # [B, L]
  weights = batch["decoder_loss_weights"].astype(jnp.float32)  # [B, L]
  logits, fed, features, encoded = target_features(head, target, target_params, batch)
  p = jax.lax.stop_gradient(jax.nn.softmax(logits, axis=-1))  # [B, L, V]
  embedded = jax.lax.stop_gradient(target.embed(target_params, tokens))
  inputs, loss, out = head.fuse_layers(head_params, fed), 0.0, {}
  for k in range(feature.passes):
    predicted = head.forward(head_params, shift_features(inputs), embedded, encoded)
    regression = jnp.mean(smooth_l1(predicted - features), axis=-1)  # [B, L]
    log_q = jax.nn.log_softmax(target.feature_logits(target_params, predicted), axis=-1)
    ce = -jnp.sum(p * log_q, axis=-1)  # [B, L]
    agree = (jnp.argmax(log_q, -1) == jnp.argmax(p, -1)).astype(jnp.float32)
    loss = loss + (feature.feature_weight * regression + feature.token_weight * ce)
    if k == 0:
      tv = 0.5 * jnp.sum(jnp.abs(p - jnp.exp(log_q)), axis=-1)
      out = {"ce_sum": jnp.sum(ce * weights), "feature_sum": jnp.sum(regression * weights),
             "correct_sum": jnp.sum(agree * weights), "tv_sum": jnp.sum(tv * weights)}
    inputs = predicted
  loss = loss / feature.passes
  if feature.passes > 1:
    out["fed_correct_sum"] = jnp.sum(agree * weights)
  return dict(out, loss_sum=jnp.sum(loss * weights), weight_sum=jnp.sum(weights))


def held_out(feature: FeatureHeadTraining) -> FeatureHeadTraining:
  """The loss an evaluation computes: a rollout of max(eval_guesses, rollout_steps) guesses
  per position (one pass), the training's weights otherwise."""
  return dataclasses.replace(feature, passes=1,
                             rollout_steps=max(feature.eval_guesses, feature.rollout_steps))


def head_record(total: Dict[str, Any]) -> Dict[str, Any]:
  """Summed `head_loss_sums` (over log steps or evaluation batches) -> the logged means:
  `trainer.summarize`'s (loss, cross_entropy, accuracy = guess 1's argmax agreement,
  teacher_tv), feature_loss, fed_agreement (the last pass's or guess's), agreement_by_guess
  (a rollout's) and, from it, chain_tokens_estimate: 1 + sum_k prod_{j <= k} a_j, the tokens
  per target call of a greedy chain of that many guesses if each guess's acceptance were its
  agreement here and independent of the others (a training diagnostic; the drafted tables
  measure tokens per call)."""
  record = dict(base.summarize(total),
                feature_loss=float(total["feature_sum"]) / max(float(total["weight_sum"]), 1.0))
  if "fed_correct_sum" in total:
    record["fed_agreement"] = (float(total["fed_correct_sum"])
                               / max(float(total.get("fed_weight_sum", total["weight_sum"])), 1.0))
  steps = sorted(int(name[4:-12]) for name in total if name.endswith("_correct_sum")
                 and name.startswith("step"))
  if steps:  # a rollout's agreement by guess: guess 1 is step 0's (`accuracy`)
    by_guess = [record["accuracy"]] + [
        float(total[f"step{k}_correct_sum"]) / max(float(total[f"step{k}_weight_sum"]), 1.0)
        for k in steps]
    record["agreement_by_guess"] = by_guess
    record["chain_tokens_estimate"] = 1.0 + float(np.sum(np.cumprod(by_guess)))
  return record


def held_out_step(head: FeatureHead, target: Any, target_params: Any,
                  feature: FeatureHeadTraining, ids: Any = None) -> Any:
  """The jitted held-out step: (head params, batch) -> `head_loss_sums` of `held_out(feature)`,
  over the ids int32 [K] (a vocab_limit's; None: all)."""
  evaluation = held_out(feature)
  ids = None if ids is None else jnp.asarray(ids, jnp.int32)
  return jax.jit(lambda params, batch: head_loss_sums(head, target, params, target_params,
                                                       batch, evaluation, ids))


def evaluate_with(step: Any, params: Any, batches: Any) -> Dict[str, Any]:
  """`head_record` of `step` (a `held_out_step`) summed over `batches`; ValueError without a
  batch."""
  parts = jax.device_get([step(params, batch) for batch in batches])
  if not parts:
    raise ValueError("evaluate needs at least one batch")
  return head_record({name: sum(float(part[name]) for part in parts) for name in parts[0]})


class HeadTrainer:
  """The head, the frozen target, the optimizer and the jitted step (the `trainer.restore`
  interface: `model` and `init_state`)."""

  def __init__(self, head: FeatureHead, target: Any, target_params: Any, optimizer: Any,
               num_steps: int, feature: FeatureHeadTraining, ids: Any = None):
    self.model = head
    self.target_params = target_params
    self.optimizer = base.make_optimizer(optimizer, num_steps)
    ids = None if ids is None else jnp.asarray(ids, jnp.int32)

    def loss_fn(params, batch):
      sums = head_loss_sums(head, target, params, target_params, batch, feature, ids)
      return sums["loss_sum"] / jnp.maximum(sums["weight_sum"], 1.0), sums

    def step_fn(state, batch):
      (_, sums), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch)
      updates, opt_state = self.optimizer.update(grads, state.opt_state, state.params)
      return state.replace(step=state.step + 1, params=optax.apply_updates(state.params, updates),
                           opt_state=opt_state), sums

    self.train_step = jax.jit(step_fn, donate_argnums=0)
    self._opt_init = jax.jit(self.optimizer.init)
    self._eval_step = held_out_step(head, target, target_params, feature, ids)

  def evaluate(self, params: Any, batches: Any) -> Dict[str, Any]:
    """`head_record` of the held-out rollout (`held_out`) summed over `batches`; ValueError
    without a batch."""
    return evaluate_with(self._eval_step, params, batches)

  def init_state(self, params: Any, step: int = 0, opt_state: Any = None):
    """A `TrainState` at `step` with float32 `params` and a fresh or given optax state."""
    params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)
    return base.TrainState(step=jnp.asarray(step, jnp.int32), params=params,
                           opt_state=self._opt_init(params) if opt_state is None
                           else opt_state)


def train_feature_head(head_config: FeatureHeadConfig, data: Optional[DataConfig] = None,
                       optimizer: Any = None, config: Any = None,
                       feature: Optional[FeatureHeadTraining] = None):
  """Trains (or resumes) a feature head; see the module docstring. Configs left None are
  built from gin bindings. Returns a `specjax.train.TrainResult`."""
  data = data if data is not None else gin.get_configurable(DataConfig)()
  optimizer = (optimizer if optimizer is not None
               else gin.get_configurable(base.OptimizerConfig)())
  config = config if config is not None else gin.get_configurable(base.TrainConfig)()
  feature = feature if feature is not None else gin.get_configurable(FeatureHeadTraining)()
  if config.init_from is not None:
    raise ValueError("TrainConfig.init_from is not supported for a feature head; resume by "
                     "running again with the same model_dir (a fresh run may start from a "
                     "trained head: FeatureHeadTraining.warm_start)")
  head = FeatureHead(head_config)
  target, target_params = load_target(feature.target)
  head.check_target(target)  # before anything is written
  train_batches, eval_batches = make_batches(data, target.config)
  if os.path.exists(config.model_dir) and not os.path.isdir(config.model_dir):
    raise ValueError(f"TrainConfig.model_dir {config.model_dir} is a file, not a folder")
  os.makedirs(config.model_dir, exist_ok=True)
  check_model_gin(config.model_dir, head_config, write=False)
  ranking = token_ranking(train_batches.features, head_config.vocab_size)
  ids = None if feature.vocab_limit is None else ranking[:feature.vocab_limit]
  trainer = HeadTrainer(head, target, target_params, optimizer, config.num_steps, feature, ids)
  recorded = json.loads(json.dumps(dataclasses.asdict(feature), default=str))
  for field in ("passes", "rollout_steps", "rollout_decay", "vocab_limit", "warm_start"):
    if getattr(feature, field) == _DEFAULTS[field]:  # defaults stay out of the fingerprint:
      del recorded[field]  # runs from before these fields existed resume either way
  del recorded["eval_guesses"]  # what an evaluation measures changes no training step
  fingerprint = dict(resume_fingerprint(head_config, data, optimizer, config), feature=recorded)
  state = restore(config.model_dir, trainer, fingerprint, config.allow_changed_training)
  if state is None:
    params = head.init(jax.random.PRNGKey(config.seed))
    if feature.warm_start is not None:
      params = warm_start_params(head, params, load_head(feature.warm_start)[1],
                                 target.num_feature_layers)
    state = trainer.init_state(params)
  start = int(state.step)
  check_model_gin(config.model_dir, head_config)  # the run is accepted: now write
  _write_token_ranking(config.model_dir, train_batches.features, head_config.vocab_size)
  base._truncate_metrics(config.model_dir, start)  # pylint: disable=protected-access
  result = base.TrainResult(step=start, start_step=start, params=None, history=[], evals=[],
                            tokens_per_second=float("nan"), checkpoint=None,
                            model_config=head_config, data=data, optimizer=optimizer,
                            config=config)
  pending = []
  for step in range(start, config.num_steps):
    state, sums = trainer.train_step(state, train_batches.batch(step))
    pending.append(sums)
    done = step + 1
    if done in (start + 1, config.num_steps) or done % config.log_every == 0:
      result.history.append(_log(config, jax.device_get(pending), done))
      pending = []
    last = done == config.num_steps
    if config.eval_every and (last or done % config.eval_every == 0):
      result.evals.append(_evaluate(config, trainer, state, eval_batches, done))
    if last or done % config.checkpoint_every == 0:
      saved = save_checkpoint(config.model_dir, state,
                              config.final_dtype if last else "float32",
                              config.keep_checkpoints, fingerprint)
      result.checkpoint = saved if last else result.checkpoint
  result.step = int(state.step)
  result.params = jax.device_get(state.params)
  return result


def _evaluate(config: Any, trainer: HeadTrainer, state: Any, eval_batches: Any,
              done: int) -> Dict[str, Any]:
  """The held-out record at step `done` (`HeadTrainer.evaluate` over `config.eval_batches`
  validation batches), appended to metrics.jsonl and printed with progress."""
  record = dict(trainer.evaluate(state.params, eval_batches.eval_batches(config.eval_batches)),
                step=done)
  base._append_metrics(config.model_dir, dict(record, split="validation"))  # pylint: disable=protected-access
  if config.progress:
    print(f"step {done}: validation agreement by guess "
          + " ".join(f"{a:.3f}" for a in record["agreement_by_guess"])
          + f" (chain estimate {record['chain_tokens_estimate']:.2f} tokens per call) "
          f"1-TV {1 - record['teacher_tv']:.3f}", flush=True)
  return record


def _log(config: Any, window: Any, done: int) -> Dict[str, float]:
  """The metrics of the steps since the last log point (their loss sums), appended to
  metrics.jsonl and printed with progress; FloatingPointError when the loss diverged."""
  total = {name: sum(float(sums[name]) for sums in window) for name in window[0]}
  record = dict(head_record(total), step=done)
  base._append_metrics(config.model_dir, dict(record, split="train"))  # pylint: disable=protected-access
  if not math.isfinite(record["loss"]):
    base._diverged(config.model_dir, done, f"the training loss is {record['loss']}")  # pylint: disable=protected-access
  if config.progress:
    print(f"step {done}: loss {record['loss']:.4f} feature {record['feature_loss']:.4f} "
          f"agreement {record['accuracy']:.3f} 1-TV {1 - record['teacher_tv']:.3f}"
          + (f" fed {record['fed_agreement']:.3f}" if "fed_agreement" in record else "")
          + (" by guess " + " ".join(f"{a:.3f}" for a in record["agreement_by_guess"])
             if "agreement_by_guess" in record else ""),
          flush=True)
  return record


_DEFAULTS = {field.name: field.default for field in dataclasses.fields(FeatureHeadTraining)}

base.OTHER_LOOPS[FeatureHeadConfig] = train_feature_head
