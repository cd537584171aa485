"""Checkpoints of `specjax.train`: T5X params, the optax state beside them, model.gin.

`save_checkpoint` writes `checkpoint_N` with `specjax.checkpoints.save_t5x`,
committing in the same atomic rename (so a checkpoint is never seen without
them):
  optimizer_state.npz   the optax state's leaves and tree paths as plain numpy
                        arrays, never pickled (float32 checkpoints only);
  train_state.json      the step, whether the optimizer state is there, and the
                        run's resume fingerprint (model, data, optimizer, loss,
                        and the schedule's length when it depends on it).
`restore` resumes from the newest checkpoint that has its optimizer state (a
newer one without it, a bfloat16 export, is passed over), refuses a run whose
fingerprint differs unless asked, and only without any checkpoint with an
optimizer state falls back to params alone (a T5X checkpoint to fine-tune).
"""
from __future__ import annotations

import dataclasses
import io
import json
import logging
import os
import zipfile
from typing import Any, Dict, List, Mapping, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from specjax import checkpoints
from specjax import files
from specjax.models.model_gin import MODEL_GIN, model_gin_text, read_model_gin
from specjax.train.batches import data_files

log = logging.getLogger("specjax.train")
OPT_STATE_FILE = "optimizer_state.npz"
TRAIN_STATE_FILE = "train_state.json"


def check_model_gin(model_dir: str, config: Any, write: bool = True) -> None:
  """ValueError if `model_dir/model.gin` describes another model; writes it when
  absent and `write` (never replaces one).

  The file is read with the restricted parser (`specjax.models.read_model_gin`).
  """
  path = os.path.join(model_dir, MODEL_GIN)
  if os.path.lexists(path):
    old = read_model_gin(path)
    if old != config:
      diff = sorted(f.name for f in dataclasses.fields(config)
                    if type(old) is not type(config)
                    or getattr(old, f.name) != getattr(config, f.name))
      raise ValueError(f"{path} describes a different model than this run's config "
                       f"({type(old).__name__} vs {type(config).__name__}, differing "
                       f"fields: {diff}); use another model_dir or the same config")
    return
  if write:
    files.write_file(path, model_gin_text(config).encode("utf-8"))


def _tree_names(tree: Any) -> List[str]:
  return [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


def opt_state_bytes(opt_state: Any) -> bytes:
  """The optax state's leaves and tree paths as an .npz file (no pickle)."""
  leaves = jax.device_get(jax.tree_util.tree_leaves(opt_state))
  arrays = {f"leaf_{i}": np.asarray(x) for i, x in enumerate(leaves)}
  arrays["names"] = np.asarray(_tree_names(opt_state), dtype=np.str_)
  buf = io.BytesIO()
  np.savez(buf, **arrays)
  return buf.getvalue()


def save_opt_state(folder: str, opt_state: Any) -> str:
  """Writes the optax state to `folder/optimizer_state.npz` (atomically, no pickle)."""
  path = os.path.join(folder, OPT_STATE_FILE)
  files.write_file(path, opt_state_bytes(opt_state))
  return path


def _inside(folder: str, name: str) -> str:
  """folder/name, refusing a symlink that leads out of `folder`."""
  path = os.path.join(folder, name)
  root, real = os.path.realpath(folder), os.path.realpath(path)
  if not real.startswith(root.rstrip(os.sep) + os.sep):
    raise ValueError(f"{path} is a symlink to {real}, outside the checkpoint folder "
                     f"{root}; refusing to read it")
  return path


def _npz_header(archive: zipfile.ZipFile, key: str) -> Tuple[Tuple[int, ...], np.dtype]:
  """Shape and dtype of one .npy member, read from its header alone."""
  with archive.open(key + ".npy") as f:
    version = np.lib.format.read_magic(f)
    read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
            else np.lib.format.read_array_header_2_0)
    shape, _, dtype = read(f)
  return tuple(shape), dtype


def load_opt_state(folder: str, like: Any) -> Optional[Any]:
  """The optax state saved in `folder`, structured as `like`; None if absent or not matching.

  Tree paths, shapes and dtypes are compared from the file's headers before any
  array is read.

  Args:
    folder: a checkpoint folder.
    like: an optax state (arrays or jax.ShapeDtypeStruct leaves) of the current
      optimizer; a saved state with other tree paths or shapes is not loaded.
  Raises:
    ValueError: an unreadable file, or a symlink out of `folder`.
  """
  if not os.path.lexists(os.path.join(folder, OPT_STATE_FILE)):
    return None
  path = _inside(folder, OPT_STATE_FILE)
  leaves, treedef = jax.tree_util.tree_flatten(like)
  try:
    with zipfile.ZipFile(path) as archive:
      members = {n[:-len(".npy")] for n in archive.namelist() if n.endswith(".npy")}
      if members != {"names"} | {f"leaf_{i}" for i in range(len(leaves))}:
        return None
      for i, leaf in enumerate(leaves):
        shape, _ = _npz_header(archive, f"leaf_{i}")
        if shape != tuple(np.shape(leaf)):
          return None
    with np.load(path, allow_pickle=False) as saved:
      if [str(n) for n in saved["names"]] != _tree_names(like):
        return None
      restored = [jnp.asarray(saved[f"leaf_{i}"], dtype=leaf.dtype)
                  for i, leaf in enumerate(leaves)]
  except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
    raise ValueError(f"unreadable optimizer state {path}: {e}") from e
  return jax.tree_util.tree_unflatten(treedef, restored)


# ----------------------------------------------------------------------------
# What a resumed run must share with the checkpoint it resumes.


def _plain(x: Any) -> Any:
  """A dataclass (or None) as JSON-ready values (tuples become lists)."""
  if x is None:
    return None
  return json.loads(json.dumps(dataclasses.asdict(x), default=str))


def resume_fingerprint(model_config: Any, data: Any, optimizer: Any, config: Any,
                       distill: Any = None) -> Dict[str, Any]:
  """Everything that must not change for a resumed run to equal an uninterrupted one.

  The model, the data (batch size, lengths, seed, files...) and the content of
  its files (sha256 of the split files under data_dir and of vocab_path: a file
  edited in place is changed data), the optimizer and its schedule, the z-loss,
  a distillation teacher, and `num_steps` when the schedule depends on it
  (cosine decay ends at the last step).
  """
  hashes = {} if data is None else {
      str(p): files.sha256(str(p)) for p in data_files(data) if p.is_file()}
  return {"model": dict(_plain(model_config), **{"class": type(model_config).__name__}),
          "data": _plain(data), "data_sha256": hashes,
          "optimizer": _plain(optimizer), "z_loss": config.z_loss,
          "num_steps": config.num_steps if optimizer.decay == "cosine" else None,
          "distill": _plain(distill),
          **({"init_from": os.fspath(config.init_from)}
             if getattr(config, "init_from", None) else {})}


def fingerprint_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> List[str]:
  """'section.field: old -> new' for every difference (sections flattened one level)."""
  out = []
  for key in sorted(set(old) | set(new)):
    a, b = old.get(key), new.get(key)
    if isinstance(a, dict) and isinstance(b, dict):
      out += [f"{key}.{k}: {a.get(k)!r} -> {b.get(k)!r}"
              for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    elif a != b:
      out.append(f"{key}: {a!r} -> {b!r}")
  return out


def _read_marker(folder: str) -> Optional[Dict[str, Any]]:
  """train_state.json of a checkpoint folder; None if absent; ValueError if unreadable."""
  if not os.path.lexists(os.path.join(folder, TRAIN_STATE_FILE)):
    return None
  path = _inside(folder, TRAIN_STATE_FILE)
  try:
    with open(path, "rb") as f:
      marker = json.loads(f.read(1 << 22))
  except (OSError, ValueError) as e:
    raise ValueError(f"unreadable {path}: {e}") from e
  if not isinstance(marker, dict):
    raise ValueError(f"{path} is not a JSON object")
  return marker


# ----------------------------------------------------------------------------
# Saving and restoring.


BUNDLED = "bundled:"
"""The prefix naming a model shipped in the package, 'bundled:PAIR/ROLE' (`specjax.app.bundled`)."""


def bundled_folder(name: Any) -> Any:
  """'bundled:PAIR/ROLE' -> the shipped folder specjax/assets/pairs/PAIR/ROLE, wherever the
  package is installed and whatever the working folder; any other value unchanged."""
  if not isinstance(name, str) or not name.startswith(BUNDLED):
    return name
  pair, _, role = name[len(BUNDLED):].partition("/")
  if not pair or not role or "/" in role or pair in (".", "..") or role in (".", ".."):
    raise ValueError(f"{name!r} must name a shipped model as 'bundled:PAIR/ROLE', e.g. "
                     "'bundled:lm/target'")
  return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets",
                      "pairs", pair, role)


def read_trained_folder(folder: Any, what: str) -> Tuple[str, Any]:
  """(folder, its model config) for a folder written by specjax.train (its latest
  checkpoint is loaded from it), one checkpoint_N inside such a folder, or a shipped model
  'bundled:PAIR/ROLE' (`bundled_folder`).

  Raises FileNotFoundError naming `what` (e.g. 'teacher') when there is no model.gin.
  """
  folder = os.fspath(bundled_folder(folder)).rstrip("/")
  model_dir = (os.path.dirname(folder) if os.path.basename(folder).startswith("checkpoint_")
               else folder)
  if not os.path.isfile(os.path.join(model_dir, MODEL_GIN)):
    raise FileNotFoundError(f"{what} {folder}: no model.gin in {model_dir} (give a folder "
                            "written by specjax.train)")
  return folder, read_model_gin(model_dir)


def list_checkpoints(model_dir: str) -> List[int]:
  """Steps of the complete `checkpoint_N` folders in `model_dir`, ascending."""
  return [step for step, _ in checkpoints.list_checkpoint_dirs(model_dir)]


def save_checkpoint(model_dir: str, state: Any, dtype: str = "float32",
                    keep: int = 2, fingerprint: Optional[Mapping[str, Any]] = None) -> str:
  """Writes `checkpoint_N` (params, optimizer state when float32, train_state.json)
  in one atomic commit, then prunes the oldest checkpoints down to `keep`.

  Args:
    model_dir: the model folder.
    state: a TrainState (`step`, `params`, `opt_state`).
    dtype: 'float32' (resumable) or 'bfloat16' (an export without optimizer state).
    keep: checkpoints kept (the oldest are removed after the new one is in place).
    fingerprint: `resume_fingerprint` of the run, recorded for `restore`.
  """
  step = int(state.step)
  params = jax.device_get(state.params)
  with_opt = dtype == "float32"
  marker = {"step": step, "optimizer_state": with_opt, "fingerprint": fingerprint}
  extra = {TRAIN_STATE_FILE: json.dumps(marker, indent=1).encode("utf-8")}
  if with_opt:
    extra[OPT_STATE_FILE] = opt_state_bytes(state.opt_state)
  path = checkpoints.save_t5x(params, model_dir, step=step, dtype=dtype, overwrite=True,
                              extra_files=extra)
  dirs = checkpoints.list_checkpoint_dirs(model_dir)
  resumable = [s for s, folder in dirs if os.path.lexists(os.path.join(folder, OPT_STATE_FILE))]
  for old in [s for s, _ in dirs][:-keep]:
    if not with_opt and resumable and old == resumable[-1]:
      log.warning("%s: keeping checkpoint_%d beyond keep_checkpoints=%d: it is the newest one "
                  "a run can resume from (checkpoint_%d is a %s export without optimizer "
                  "state)", model_dir, old, keep, step, dtype)
      continue
    checkpoints.delete_checkpoint(model_dir, old)
  return path


def _choose(model_dir: str) -> Tuple[int, str, Optional[Dict[str, Any]], bool]:
  """(step, folder, train_state.json or None, has optimizer state) to resume from."""
  params_only, incomplete = [], []
  for step, folder in reversed(checkpoints.list_checkpoint_dirs(model_dir)):
    try:
      marker = _read_marker(folder)
    except ValueError as e:
      incomplete.append(f"{folder} ({e})")
      continue
    has_opt = os.path.lexists(os.path.join(folder, OPT_STATE_FILE))
    if marker is not None and marker.get("optimizer_state") and not has_opt:
      incomplete.append(f"{folder} (no {OPT_STATE_FILE})")
      continue
    if has_opt:
      if params_only or incomplete:
        log.warning("resuming from %s, the newest checkpoint with its optimizer state; "
                    "passed over: %s", folder,
                    ", ".join([p[1] for p in params_only] + incomplete))
      return step, folder, marker, True
    params_only.append((step, folder, marker))
  if not params_only:
    raise ValueError(f"{model_dir}: no complete checkpoint to resume from; incomplete: "
                     f"{', '.join(incomplete)}. Remove them to start afresh")
  if incomplete:
    log.warning("%s: incomplete checkpoints passed over: %s", model_dir, ", ".join(incomplete))
  step, folder, marker = params_only[0]
  return step, folder, marker, False


def _drop_added_defaults(saved: Any, now: Any, config: Any) -> None:
  """Removes from `now` (this run's model fingerprint) each field that `saved` (a
  checkpoint's) lacks and that holds its dataclass default in `config`: a field added to the
  model config since that checkpoint was written, at the value that reproduces its model."""
  if not (isinstance(saved, dict) and isinstance(now, dict) and dataclasses.is_dataclass(config)):
    return
  for field in dataclasses.fields(config):
    if (field.name in now and field.name not in saved
        and field.default is not dataclasses.MISSING
        and now[field.name] == json.loads(json.dumps(field.default, default=str))):
      del now[field.name]


def restore(model_dir: str, trainer: Any, fingerprint: Optional[Mapping[str, Any]] = None,
            allow_changed: bool = False) -> Optional[Any]:
  """The state to resume from in `model_dir`, or None if it holds no checkpoint.

  The newest checkpoint with its optimizer state is used; only when none has
  one, the newest checkpoint's params with a fresh optimizer state (a warning
  says so: a T5X checkpoint to fine-tune, or a bfloat16 export).

  Args:
    model_dir: the model folder.
    trainer: its `model` and `init_state` build the state.
    fingerprint: `resume_fingerprint` of this run, compared with the one the
      checkpoint recorded (checkpoints written elsewhere record none).
    allow_changed: resume even though data, optimizer or schedule changed
      (warns); a changed model is always refused.

  Raises:
    ValueError: a changed model, or (unless `allow_changed`) a changed training
      setup or an optimizer state that does not fit; only incomplete checkpoints.
  """
  if not checkpoints.list_checkpoint_dirs(model_dir):
    return None
  step, folder, marker, has_opt = _choose(model_dir)
  saved = (marker or {}).get("fingerprint")
  if isinstance(saved, dict) and fingerprint is not None:
    now = json.loads(json.dumps(fingerprint))
    if "data_sha256" not in saved:  # recorded before file contents were
      now.pop("data_sha256", None)
    _drop_added_defaults(saved.get("model"), now.get("model"),
                         getattr(getattr(trainer, "model", None), "config", None))
    diff = fingerprint_diff(saved, now)
    if any(d.startswith("model.") for d in diff):
      raise ValueError(f"{folder} was trained with another model config "
                       f"({[d for d in diff if d.startswith('model.')]}); use another "
                       "model_dir or the same config")
    if diff and not allow_changed:
      raise ValueError(
          f"{folder} was trained with another setup, so resuming would not continue that "
          f"run exactly: {diff}. Restore those settings, use another model_dir, or pass "
          "--gin.ALLOW_CHANGED_TRAINING=True (TrainConfig.allow_changed_training) to "
          "continue with the new ones")
    if diff:
      log.warning("%s: resuming with a changed setup (allowed): %s", folder, diff)
  params = checkpoints.load_t5x_for_model(folder, trainer.model, dtype="float32")
  state = trainer.init_state(params, step=step)
  if not has_opt:
    log.warning("%s has no %s: the optimizer state starts from scratch", folder,
                OPT_STATE_FILE)
    return state
  opt_state = load_opt_state(folder, state.opt_state)
  if opt_state is None:
    if saved is not None and not allow_changed:
      raise ValueError(f"{folder}/{OPT_STATE_FILE} does not fit this run's optimizer "
                       "(other tree paths or shapes); pass "
                       "--gin.ALLOW_CHANGED_TRAINING=True to restart the optimizer state")
    log.warning("%s: %s does not fit this optimizer: the optimizer state starts from "
                "scratch", folder, OPT_STATE_FILE)
    return state
  return state.replace(opt_state=opt_state)
