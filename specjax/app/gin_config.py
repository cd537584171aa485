"""gin the T5X way: `--gin_file` (repeatable), `--gin.NAME=VALUE`, `--gin_search_paths`.

Registers specjax's configurables and resolves model gin files into configs
under a scope, so one run can hold two models (target and draft) whose size
files bind the same `T5Config.*` / `DecoderOnlyConfig.*` names.

Trust: `--gin_file` files and `--gin.` bindings are gin, which can import
modules and so run code, as in T5X: pass only files you trust. Model gin
files named by TARGET_MODEL / DRAFT_MODEL (a model folder's `model.gin`, which
may come with downloaded weights) are NOT given to gin: `read_model_file`
parses them with the restricted parser of `specjax.models.model_gin`, which
reads T5X's model gin syntax without running any of it (imports skipped, nothing
called, values literals); the model's values are then bound with `gin.bind_parameter`.
"""
from __future__ import annotations

import contextlib
import difflib
import io
import logging
import os
import re
import tokenize
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import gin

from specjax.app import bundled, gin_files, gin_remote
from specjax.app.gin_files import GIN_DIR, GinFiles
from specjax.decode import DecodeConfig, beam_search, speculative_beam_search
from specjax.draft import DynamicTree, StaticTree
from specjax.models import DecoderOnlyConfig, FeatureHeadConfig, GemmaConfig, T5Config
from specjax.models import model_gin
from specjax.models.model_gin import ModelFile, config_from_model_file
from specjax.sampling import Sampling
from specjax.runtime.sharding import Partitioner
from specjax.verify import BlockVerifier, FusedVerifier, ReferenceVerifier, SigmoidApproxVerifierNotExact




def register(obj, module: str, name: Optional[str] = None):
  """THE way specjax registers a gin configurable: `gin.register`, which leaves `obj` itself
  untouched (direct Python calls never see gin bindings; gin files reach it as `@Name()`,
  and entry points call `gin.get_configurable(obj)`). Idempotent (module reloads)."""
  try:
    gin.register(name, module=module)(obj) if name else gin.register(obj, module=module)
  except ValueError:  # already registered (module reloaded)
    pass
  return obj


for _obj, _module in ((T5Config, "specjax.models"), (DecoderOnlyConfig, "specjax.models"),
                      (FeatureHeadConfig, "specjax.models"), (GemmaConfig, "specjax.models"),
                      (Sampling, "specjax"), (DecodeConfig, "specjax.decode"),
                      (ReferenceVerifier, "specjax.verify"), (FusedVerifier, "specjax.verify"),
                      (BlockVerifier, "specjax.verify"),
                      (SigmoidApproxVerifierNotExact, "specjax.verify"),
                      (Partitioner, "specjax.runtime.sharding"), (beam_search, "specjax.decode"),
                      (speculative_beam_search, "specjax.decode")):
  register(_obj, _module)
# Token-tree shapes: `@specjax.draft.tree_spines()` with `tree_spines.lengths = (12, 2, 1)`,
# `tree_paths.paths`, `tree_branching.branching`, or `@specjax.draft.DynamicTree()`.
for _obj, _name in ((StaticTree.from_spines, "tree_spines"), (StaticTree.from_paths, "tree_paths"),
                    (StaticTree.from_branching, "tree_branching"), (DynamicTree, None)):
  register(_obj, "specjax.draft", _name)


def split_gin_args(argv: Sequence[str]) -> Tuple[List[str], List[str], List[str], List[str]]:
  """Splits `--gin_file=F`, `--gin.X=Y`, `--gin_search_paths=A,B` out of argv.

  Returns (gin_files, bindings, search_paths, remaining argv).
  """
  files, bindings, paths, rest = [], [], [], []
  args = list(argv)
  i = 0
  while i < len(args):
    arg = args[i]
    value = None
    for flag in ("--gin_file", "--gin_search_paths"):
      if arg == flag and i + 1 < len(args):
        value, i = args[i + 1], i + 1
      elif arg.startswith(flag + "="):
        value = arg.split("=", 1)[1]
      if value is not None:
        (files.append(value) if flag == "--gin_file" else
         paths.extend(p for p in value.split(",") if p))
        break
    else:
      if arg.startswith("--gin."):
        bindings.append(arg[len("--gin."):])
      else:
        rest.append(arg)
    i += 1
  return files, bindings, paths, rest


def search_paths(extra: Sequence[str] = ()) -> List[str]:
  """Where model gin files are found: the user's search paths, specjax's gin/ and the working
  directory (run gin files are found by `gin_files.locate`, never on search paths)."""
  return [*extra, str(GIN_DIR), os.getcwd()]


def resolve(path: str, paths: Sequence[str]) -> str:
  """Finds a model gin file on the search paths; FileNotFoundError names what was tried.

  'bundled:PAIR/ROLE' names the model.gin of a shipped model (`specjax.app.bundled`). A
  relative name that is one of specjax's own gin files and is also found elsewhere on the
  paths is refused, naming both: a file specjax ships is never shadowed.
  """
  path = bundled.resolve(path, "model")
  if os.path.isabs(path) or path.startswith("gs://"):
    if gin_remote.exists(path):
      return _a_file(path)
    raise FileNotFoundError(f"gin file '{path}' not found")
  found = [os.path.join(base, path) for base in paths
           if gin_remote.exists(os.path.join(base, path))]
  real = list(dict.fromkeys(gin_remote.real(f) for f in found))
  if len(real) > 1 and any(gin_files.shipped(f) for f in real):
    ours = next(f for f in real if gin_files.shipped(f))
    other = next(f for f in real if not gin_files.shipped(f))
    raise ValueError(f"model gin file '{path}' is both specjax's {ours} and {other}: refusing "
                     "to guess which one to read; name yours by its path, or remove it")
  if found:
    return _a_file(found[0])
  raise FileNotFoundError(f"gin file '{path}' not found on search paths {list(paths)}")


def _a_file(path: str) -> str:
  if os.path.isdir(path):
    raise IsADirectoryError(f"gin file '{path}' is a folder, not a gin file (a trained model "
                            "folder's config is its model.gin)")
  return path


_UNBOUND_MACRO = re.compile(r"macro\(\) missing 1 required positional argument.*?"
                            r"in scope '([^']*)'", re.S)


_UNBOUND_ARGUMENT = re.compile(
    r"No values supplied by Gin or caller for arguments: \[([^\]]*)\]"
    r".*?In call to configurable '([^']+)'(?:[^\n]*?in scope '([^']*)')?", re.S)


def unbound_macro(error: BaseException) -> Optional[ValueError]:
  """gin's TypeError for something a run uses but nothing binds, as one line naming it (else
  None): a `%NAME` macro, or a required parameter of a configurable the run calls
  (`VOCABULARY = @Vocab()` without `Vocab.model_path`)."""
  match = _UNBOUND_MACRO.search(str(error))
  if match is not None:
    name = match.group(1)
    return ValueError(f"gin macro %{name} is used but never bound: bind it (--gin.{name}=... "
                      f"or '{name} = ...' in a gin file) or remove the reference")
  match = _UNBOUND_ARGUMENT.search(str(error))
  if match is None:
    return None
  names = [n.strip(" '\"") for n in match.group(1).split(",") if n.strip()]
  configurable, scope = match.group(2), match.group(3)
  where = f" (bound to {scope})" if scope else ""
  bind = " and ".join(f"{configurable}.{n}" for n in names)
  return ValueError(f"@{configurable}(){where} needs {', '.join(names)}: bind {bind} in a gin "
                    f"file or with --gin.{configurable}.{names[0] if names else 'NAME'}=...")


def query_macro(name: str, default=None):
  """The value of a gin macro, following `NAME = %OTHER` (runs/decode.gin's T5X aliases), or
  `default` when it is unbound (a %gin.REQUIRED one comes back as gin's reference)."""
  for _ in range(8):
    try:
      value = gin.query_parameter(f"%{name}")
    except ValueError:
      return default
    if not (isinstance(value, gin.config.ConfigurableReference)
            and value.scoped_selector.endswith("/gin.macro")):
      return value
    name = value.scoped_selector[:-len("/gin.macro")]
  return default


T5X_ALIASES = {"CHECKPOINT_PATH": "TARGET_CHECKPOINT", "INFER_OUTPUT_DIR": "OUTPUT_DIR"}
"""T5X infer.gin's macro names that runs/decode.gin accepts -> specjax's macro they set."""


RUN_FILE = "runs/decode.gin"
"""The run file every main-job run includes: it binds the job and declares what a run needs."""


def run_files(gin_files_: Sequence[str], default: str, paths: Sequence[str] = ()) -> List[str]:
  """The gin files a main-job run parses: `gin_files_` alone when one of them is a run file,
  else `default` first and `gin_files_` on top of it.

  A run file includes `runs/decode.gin` (directly or through its includes) or is it, as the
  bundled runs and a user's own checkpoint file do. Any other file (`decoding/sampling.gin`,
  `decoding/tree.gin`, a user's file of bindings) changes the default run, as a T5X user
  expects of a settings file, instead of replacing it with a run that has no inputs. Files are
  found by `gin_files.locate` (`paths`, the search paths, only name a file found there).
  """
  run_file = os.path.realpath(GIN_DIR / RUN_FILE)
  if any(run_file in GinFiles(paths).included(f) for f in gin_files_):
    return list(gin_files_)
  return [default, *gin_files_]


MODEL_MACROS = {"target": "TARGET_MODEL", "draft": "DRAFT_MODEL"}
_SCOPE_FILE: Dict[str, ModelFile] = {}


def parse(gin_files_: Sequence[str], bindings: Sequence[str], paths: Sequence[str] = ()) -> None:
  """Parses run files then bindings (T5X order): the files and their includes found by
  `gin_files.locate` (never on `paths`), model gin files on `paths` (`resolve`).

  Model gin files named by the macros TARGET_MODEL / DRAFT_MODEL are then read
  under the scopes `target/` and `draft/`, and the run files and bindings are
  parsed again on top, so `--gin.draft/T5Config.num_heads=...` still wins.
  """
  _SCOPE_FILE.clear()
  paths = gin_files.check_search_paths(paths)
  all_paths = search_paths(paths)
  files = [gin_files.locate(f, None, paths) for f in gin_files_]
  _parse_files_and_bindings(files, bindings, paths)
  check_code_macros()
  models = {scope: query_macro(macro) for scope, macro in MODEL_MACROS.items()}
  models = {s: m for s, m in models.items() if isinstance(m, str)}
  if models:
    gin.clear_config()
    for scope, model_file in models.items():
      found = _SCOPE_FILE[scope] = read_model(model_file, all_paths)
      if found.note():
        logging.info("%s model: %s", scope, found.note())
      for field, value in found.values.items():
        gin.bind_parameter(f"{scope}/{found.cls}.{field}", value)
    _parse_files_and_bindings(files, bindings, paths)
  unread = unread_macros(bindings)
  if unread:
    raise ValueError("; ".join(_unread_message(name) for name in unread))


CODE_MACROS = frozenset({*MODEL_MACROS.values(), "DEFAULT_TASK", "TARGET_CHECKPOINT",
                         "DRAFT_CHECKPOINT", "PAIR_TASK", "MIXTURE_OR_TASK_NAME",
                         "MIXTURE_OR_TASK_MODULE", "TASK_FEATURE_LENGTHS"})
"""Macros read by code (`query_macro`) rather than by other bindings."""

STRING_MACROS = {**{m: "a model gin file name" for m in MODEL_MACROS.values()},
                 "MIXTURE_OR_TASK_NAME": "a task name", "DEFAULT_TASK": "a task name",
                 "PAIR_TASK": "a task name"}
"""Macros read by code that must be strings (or unbound), and what each names."""


def check_code_macros() -> None:
  """ValueError naming the first macro read by code (CODE_MACROS) whose bound value has the
  wrong type: `TARGET_MODEL = 5`, `MIXTURE_OR_TASK_NAME = ['x']`, `MIXTURE_OR_TASK_MODULE = 5`
  (each gave a traceback or was silently ignored)."""
  def bound(value) -> bool:
    return value is not None and not isinstance(value, gin.config.ConfigurableReference)
  for macro, what in STRING_MACROS.items():
    value = query_macro(macro)
    if bound(value) and not isinstance(value, str):
      raise ValueError(f"{macro} must be {what} (a quoted string), got "
                       f"{type(value).__name__} {value!r}")
  modules = query_macro("MIXTURE_OR_TASK_MODULE")
  if bound(modules) and not isinstance(modules, str) and not (
      isinstance(modules, (list, tuple)) and all(isinstance(m, str) for m in modules)):
    raise ValueError("MIXTURE_OR_TASK_MODULE must be a module name or a list of module names "
                     f"(quoted strings), got {type(modules).__name__} {modules!r}")


_MACRO_BINDING = re.compile(r"^\s*([A-Za-z_]\w*)\s*=")


def _macro_refs(value, found: Set[str]) -> None:
  """Adds the names of the macros that a bound value refers to (`%NAME`) to `found`."""
  if isinstance(value, gin.config.ConfigurableReference):
    name = value.scoped_selector
    if name.endswith("/gin.macro"):
      found.add(name[:-len("/gin.macro")])
  elif isinstance(value, (list, tuple, set)):
    for v in value:
      _macro_refs(v, found)
  elif isinstance(value, dict):
    for v in (*value.keys(), *value.values()):
      _macro_refs(v, found)


def _known_macros() -> Set[str]:
  """Every macro a parsed binding refers to as `%NAME`, and the macros code reads."""
  found: Set[str] = set(CODE_MACROS)
  for params in gin.config._CONFIG.values():  # pylint: disable=protected-access
    for value in params.values():
      _macro_refs(value, found)
  return found


def _unread_message(name: str) -> str:
  """One line for a bound macro nothing reads, naming the closest real macro."""
  if name in T5X_ALIASES:
    return (f"--gin.{name}: this run binds {T5X_ALIASES[name]} itself, which T5X's {name} "
            f"stands for (runs/decode.gin: {T5X_ALIASES[name]} = %{name}); bind one of them")
  close = difflib.get_close_matches(name, sorted(_known_macros()), n=1, cutoff=0.6)
  hint = f"; did you mean {close[0]}?" if close else ""
  return f"--gin.{name}: no binding reads the macro {name}{hint}"


def unread_macros(bindings: Sequence[str]) -> List[str]:
  """The macros bound by `bindings` (`NAME=VALUE`) that no parsed binding refers to as `%NAME`
  and no code reads (CODE_MACROS): usually a misspelling (`GAMA=3`)."""
  bound = [m.group(1) for m in map(_MACRO_BINDING.match, bindings) if m]
  found = _known_macros()
  return sorted({name for name in bound if name not in found})


_BOUND_PARAMETER = re.compile(r"^\s*((?:[A-Za-z_][\w.]*/)*)([A-Za-z_][\w.]*)\.([A-Za-z_]\w*)\s*=")


def uncalled_bindings(bindings: Sequence[str]) -> List[str]:
  """The `--gin.` bindings of a parameter (`[scope/]Name.param=VALUE`) whose configurable the
  run has not called (so far) under that scope: the binding changed nothing. Call after the
  run; macro bindings are `unread_macros`' concern."""
  called = list(gin.config._OPERATIVE_CONFIG)  # pylint: disable=protected-access
  out = []
  for binding in bindings:
    match = _BOUND_PARAMETER.match(binding)
    if match is None:
      continue
    scope = match.group(1).rstrip("/")
    found = gin.config._REGISTRY.get_match(match.group(2))  # pylint: disable=protected-access
    if found is None:
      continue
    if not any(selector == found.selector and (not scope or scope in called_scope.split("/"))
               for called_scope, selector in called):
      out.append(binding)
  return out


def _parse_files_and_bindings(files: Sequence[str], bindings: Sequence[str],
                              paths: Sequence[str]) -> None:
  """gin's parse; a syntax error becomes a ValueError naming the file (or binding) and line."""
  try:
    with _quiet_path_probes(), GinFiles(paths).reading():
      gin.parse_config_files_and_bindings(files, bindings, finalize_config=False)
  except SyntaxError as e:
    unquoted = unquoted_string(e)
    if unquoted is not None:
      raise ValueError(unquoted) from e
    where = f"'{e.filename}', line {e.lineno}" if e.filename else "a --gin binding"
    raise ValueError(f"gin syntax error in {where}: {e.msg}\n  {(e.text or '').rstrip()}") from e
  except tokenize.TokenError as e:
    raise ValueError(f"gin syntax error in {_token_error_site(files, bindings, paths)}: "
                     f"{e.args[0] if e.args else 'unbalanced brackets or quotes'}") from e
  except ModuleNotFoundError as e:
    named = e.name or (re.findall(r"(?:No module named|import of) '?([\w.]+)", str(e)) or [""])[0]
    extra = OPTIONAL_MODULES.get(named.split(".")[0])
    if extra is None:
      raise
    raise ModuleNotFoundError(
        f"a gin file imports {named}, which is not installed: install specjax's "
        f"'{extra}' extra (pip install -e '.[{extra}]' in a checkout)", name=named) from e


def unquoted_string(error: SyntaxError) -> Optional[str]:
  """The message for a gin value that is a bare word or path (`--gin.GAMMA_POLICY=auto`: a
  string that lacks its quotes), with the binding corrected; None for any other syntax error."""
  if not re.search(r"Failed to parse token|Unable to parse value", error.msg or ""):
    return None
  name, eq, value = (error.text or "").strip().partition("=")
  name, value = name.strip(), value.strip()
  if not eq or not value or not re.fullmatch(r"[\w./~\-:]+", value) or value[0].isdigit():
    return None
  if value.lower() in ("true", "false", "none"):
    fixed, why = value.capitalize(), f"gin writes {value.capitalize()} capitalized"
  else:
    fixed, why = f"'{value}'", "a string must be quoted"
  if error.filename:
    return (f"gin: '{error.filename}', line {error.lineno}: {value} is not a gin value "
            f"({why}): write {name} = {fixed}")
  flag = f'--gin.{name}="{fixed}"' if fixed.startswith("'") else f"--gin.{name}={fixed}"
  return f"--gin.{name}={value}: {value} is not a gin value ({why}): write {flag}"


OPTIONAL_MODULES = {"seqio": "seqio", "tensorflow": "seqio", "sacrebleu": "seqio",
                    "torch": "hf", "transformers": "hf"}
"""Modules of specjax's optional extras (setup.py `extras_require`): module -> extra."""


class _PathProbeFilter(logging.Filter):
  """Drops gin's 'Path not found' errors: gin logs one for every search path an include is
  not under (its Python-package reader) before it finds the file on the next one."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not (record.levelno == logging.ERROR and record.msg == "Path not found: %s")


@contextlib.contextmanager
def _quiet_path_probes():
  probe_filter = _PathProbeFilter()
  logging.getLogger().addFilter(probe_filter)
  try:
    yield
  finally:
    logging.getLogger().removeFilter(probe_filter)


def _unbalanced(text: str) -> Optional[str]:
  """None if Python's tokenizer reads `text`; else the unclosed bracket or string and its line."""
  opened = []  # (bracket, line) still open
  try:
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
      if tok.type == tokenize.OP and tok.string in "([{":
        opened.append((tok.string, tok.start[0]))
      elif tok.type == tokenize.OP and tok.string in ")]}" and opened:
        opened.pop()
  except tokenize.TokenError as e:
    if opened:
      return f"'{opened[-1][0]}' opened on line {opened[-1][1]} is never closed"
    line = e.args[1][0] if len(e.args) > 1 else "?"
    return f"{e.args[0] if e.args else 'unbalanced quotes'} (line {line})"
  return None


def _token_error_site(files: Sequence[str], bindings: Sequence[str], paths: Sequence[str],
                      reader: Optional[GinFiles] = None) -> str:
  """Where Python's tokenizer fails (gin drops the file name): 'FILE', line N or the binding."""
  reader = reader or GinFiles(paths)
  for name in files:
    try:
      path = reader.locate(name)
      if gin_remote.real(path) in reader.chain:
        continue
      text = reader.text(path)
    except (OSError, ValueError):
      continue
    problem = _unbalanced(text)
    if problem:
      return f"'{path}' ({problem})"
    includes = [m.group(1) for m in map(gin_files.INCLUDE.match, text.splitlines()) if m]
    reader.chain.append(gin_remote.real(path))
    try:
      inner = _token_error_site(includes, (), paths, reader)
    finally:
      reader.chain.pop()
    if inner:
      return inner
  for binding in bindings:
    if _unbalanced(binding):
      return f"--gin.{binding}"
  return "" if reader.chain or not files else "the gin files " + ", ".join(files)


def model_config(scope: str):
  """The model config bound under `scope` ('target' or 'draft') by `parse`."""
  if scope not in _SCOPE_FILE:
    raise ValueError(f"no model gin file was given for '{scope}': bind "
                     f"{MODEL_MACROS.get(scope, scope.upper() + '_MODEL')} to e.g. "
                     "'models/t5_1_1_small.gin'")
  with gin.config_scope(scope):
    return gin.get_configurable(_SCOPE_FILE[scope].cls)()


def model_vocabulary(scope: str) -> Optional[Dict[str, Any]]:
  """The vocabulary the model gin file of `scope` names (its
  `seqio.SentencePieceVocabulary` bindings, as `ModelFile.vocabulary`), or None."""
  found = _SCOPE_FILE.get(scope)
  return None if found is None else found.vocabulary


def model_notes() -> List[str]:
  """One line per model gin file of the last `parse` that skipped something (T5X's
  imports, MODEL, OPTIMIZER, ...): what it skipped, for the log."""
  return [f"{scope} {f.note()}" for scope, f in _SCOPE_FILE.items() if f.note()]


def _resolver(paths: Sequence[str]):
  """Finds a model gin file and its includes: an include of a file specjax ships among
  specjax's own; another's beside the file that includes it first, then on the gin search
  paths (T5X's `include 't5x/examples/t5/t5_1_1/base.gin'` with --gin_search_paths=<a T5X
  checkout>)."""
  def find(name: str, including: Optional[str]) -> str:
    if including is not None and gin_files.shipped(including):
      return resolve(name, [str(GIN_DIR)])  # a file specjax ships includes its own files
    if including is not None and not os.path.isabs(name):
      beside = os.path.join(os.path.dirname(including), name)
      if gin_remote.is_file(beside):
        return beside
    return resolve(name, paths)
  return find


def read_model(path: str, paths: Sequence[str] = ()) -> ModelFile:
  """Reads a model gin file without gin (`specjax.models.model_gin.read_model_file`: T5X's
  syntax, nothing run), the file and its includes found as `resolve` finds gin files and
  beside the including file.

  Args:
    path: the file ('bundled:PAIR/ROLE' and search paths as for `resolve`).
    paths: gin search paths for it and its includes (default: `search_paths()`).
  Raises:
    ValueError: naming the file, line and what is wrong.
    FileNotFoundError: the file or an include is not found.
  """
  all_paths = list(paths) or search_paths()
  return model_gin.read_model_file(path, _resolver(all_paths), all_paths)


def read_model_file(path: str, paths: Sequence[str] = ()) -> Tuple[str, Dict[str, Any]]:
  """(class name, {field: value}) of a model gin file (`read_model`)."""
  found = read_model(path, paths)
  return found.cls, found.values


def model_config_from_file(path: str, paths: Sequence[str] = ()) -> Any:
  """The T5Config / DecoderOnlyConfig a model gin file describes (`read_model`)."""
  all_paths = list(paths) or search_paths()
  return config_from_model_file(path, _resolver(all_paths), all_paths)
