"""model.gin: the model config beside a checkpoint, written by specjax and read back safely.

A model folder holds `model.gin` with one binding per config field
(`DecoderOnlyConfig.emb_dim = 384`); a T5X user holds model gin files written for T5X
(`from t5x.examples.t5 import network`, `include 't5x/examples/t5/t5_1_1/base.gin'`, a
`network.T5Config:` block). Either may come with downloaded weights, so neither is given
to gin (which imports modules and so runs code): `read_model_file` reads them with a
restricted parser (`_gin_syntax`) that runs nothing: imports are skipped, configurables
never called, values read as literals; T5X's other bindings (MODEL, OPTIMIZER, ...) are
skipped and listed. `specjax.app.gin_config` reads TARGET_MODEL / DRAFT_MODEL files with
the same parser.
"""
from __future__ import annotations

import dataclasses
import os
import posixpath
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from specjax import files
from specjax.models import _gin_syntax
from specjax.models.decoder_only import DecoderOnlyConfig
from specjax.models.feature_head import FeatureHeadConfig
from specjax.models.gemma_config import GemmaConfig
from specjax.models.t5 import T5Config

MODEL_GIN = "model.gin"
MODEL_CLASSES = {"T5Config": T5Config, "DecoderOnlyConfig": DecoderOnlyConfig,
                 "FeatureHeadConfig": FeatureHeadConfig, "GemmaConfig": GemmaConfig}
"""The configurables a model gin file may bind, by their gin name."""
_CLASS_NAMES = ", ".join(MODEL_CLASSES)

Resolver = Callable[[str, Optional[str]], str]
"""(file name as written, the file that includes it or None) -> the path to open."""
MODEL_GIN_BYTES = files.MIB
"""Largest model gin file read (specjax writes a few hundred bytes)."""
MAX_INCLUDE_DEPTH = 16
"""Deepest chain of includes followed from the file named by the user."""
MAX_FILES_READ = 64
"""Most files one read opens, an include counted each time it is read (T5X's trees read 2-4)."""
MAX_BYTES_READ = 4 * files.MIB
"""Most bytes one read parses over all the files it opens."""
MAX_EXTRA_IDS = 65536
"""Largest `SentencePieceVocabulary.extra_ids` accepted (T5's vocabularies add 100)."""

WRITTEN_WHEN_SET = frozenset({"prompt_convention", "inputs_bidirectional_attention",
                              "attention_impl"})
"""Fields added after model.gin files were first written: written only when they differ
from their default, so the model.gin of an older folder still matches its config."""


def model_gin_text(config: Any) -> str:
  """gin bindings that rebuild `config` (e.g. `DecoderOnlyConfig.emb_dim = 384`)."""
  name = type(config).__name__
  lines = [f"# {name} of the checkpoints in this folder (written by specjax)."]
  lines += [f"{name}.{f.name} = {getattr(config, f.name)!r}"
            for f in dataclasses.fields(config)
            if f.name not in WRITTEN_WHEN_SET or getattr(config, f.name) != f.default]
  return "\n".join(lines) + "\n"


def resolve_local(name: str, including: Optional[str]) -> str:
  """`name` as is when absolute (or top-level), else beside the file that includes it (a
  gs:// file's includes are objects beside it, read in place)."""
  path = name if os.path.isabs(name) or files.is_remote(name) or including is None else \
      os.path.join(os.path.dirname(including), name)
  if not (_remote().exists(path) if files.is_remote(path) else os.path.isfile(path)):
    raise FileNotFoundError(f"model gin file '{name}' not found" + (
        f" (included by {including})" if including else ""))
  return path


def _remote():
  from specjax import remote  # pylint: disable=import-outside-toplevel
  return remote


def _real(path: str) -> str:
  """os.path.realpath, or a gs:// URL with its '.' and '..' parts resolved."""
  if files.is_remote(path):
    return "gs://" + posixpath.normpath(path[len("gs://"):])
  return os.path.realpath(path)


def _within(root: str, real: str) -> bool:
  return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def _open_include(name: str, resolve: Resolver, roots: Sequence[str],
                  chain: Tuple[str, ...]) -> str:
  """The real path of `name` as included by chain[-1] (None: the file the user named).

  An include must resolve inside `roots` or the folder of the file the user named, must
  not be a file of `chain` (a cycle) and may be at most MAX_INCLUDE_DEPTH deep.
  """
  including = chain[-1] if chain else None
  real = _real(resolve(name, including))
  if not chain:
    return real
  if len(chain) > MAX_INCLUDE_DEPTH:
    raise ValueError(f"{including}: includes nested more than {MAX_INCLUDE_DEPTH} deep "
                     f"(from {chain[0]})")
  if real in chain:
    raise ValueError(f"{including}: include cycle: "
                     + " -> ".join(os.path.basename(c) for c in (*chain, real)))
  allowed = [_real(r) for r in roots] + [os.path.dirname(chain[0])]
  if not any(_within(root, real) for root in allowed):
    raise ValueError(f"{including}: include '{name}' resolves to {real}, outside the gin "
                     f"search paths and the model's folder {os.path.dirname(chain[0])}; "
                     "refusing to read it")
  return real


MODEL_NAMES = {"T5Config": "T5Config", "DecoderOnlyConfig": "DecoderOnlyConfig",
               "TransformerConfig": "DecoderOnlyConfig", "FeatureHeadConfig": "FeatureHeadConfig",
               "GemmaConfig": "GemmaConfig"}
"""Configurable names a model gin file binds -> specjax's class of that name in MODEL_CLASSES:
T5X's `network.T5Config` is T5Config, its decoder-only `network.TransformerConfig` is
DecoderOnlyConfig (with T5X's prompt convention, 't5x', unless the file says otherwise)."""
NOT_DECODING = {"dropout_rate": "no dropout when decoding",
                "float32_attention_logits": "specjax's attention logits are float32 always"}
"""Fields of T5X's configs that do not change a decode: read, then skipped with a note."""
VOCABULARY_FIELDS = ("sentencepiece_model_file", "extra_ids")
"""The `seqio.SentencePieceVocabulary` bindings kept as the file's vocabulary."""


@dataclasses.dataclass(frozen=True)
class ModelFile:
  """What a model gin file says, read without gin (`read_model_file`)."""
  path: str  # the file named (as given)
  cls: str  # specjax's class: a key of MODEL_CLASSES
  values: Dict[str, Any]  # field -> its literal value (macros resolved)
  vocabulary: Optional[Dict[str, Any]]  # the seqio.SentencePieceVocabulary fields it binds
  # ({'sentencepiece_model_file': str, 'extra_ids': int}), or None
  skipped: Tuple[str, ...]  # what was read and not used: T5X's imports, macros, bindings

  def note(self) -> Optional[str]:
    """One line for the log saying what was skipped (None when nothing was)."""
    if not self.skipped:
      return None
    return (f"model gin file {self.path}: read {self.cls} ({len(self.values)} fields); "
            f"skipped what a decode does not use (never imported or called): "
            + ", ".join(self.skipped))


def _refused(where: str, why: str) -> ValueError:
  return ValueError(
      f"{where}: this line is not allowed in a model gin file ({why}); it is read with a "
      "restricted parser that runs nothing: it takes T5X's model gin syntax (imports, "
      "skipped; includes; 'NAME = value' macros; 'network.T5Config.<field> = <literal>' or "
      "'T5Config.<field> = ...', 'DecoderOnlyConfig' / 'TransformerConfig' alike, and "
      "'network.T5Config:' blocks of indented 'field = value' lines; other configurables' "
      "bindings, skipped); put anything else in a --gin_file you trust")


class _Reader:
  """The state of one read: every file of the include tree adds to it, later bindings win
  (as in gin) and macros are resolved at the end (gin reads them when a value is used)."""

  def __init__(self, resolve: Resolver, roots: Tuple[str, ...]):
    self.resolve, self.roots = resolve, roots
    self.cls: Optional[str] = None
    self.decoder_only_t5x = False  # a TransformerConfig binding was read
    self.fields: Dict[str, Tuple[Any, str, str]] = {}  # field -> (value, where, 'Class.field')
    self.model_flags: Dict[str, Tuple[Any, str, str]] = {}  # DecoderOnlyModel's, the same
    self.vocabulary: Dict[str, Tuple[Any, str, str]] = {}
    self.macros: Dict[str, Tuple[Any, str]] = {}
    self.imports = 0
    self.skipped: Dict[str, None] = {}  # ordered set
    self.files_read = 0
    self.bytes_read = 0

  def read(self, name: str, chain: Tuple[str, ...]) -> str:
    full = _open_include(name, self.resolve, self.roots, chain)
    self.files_read += 1
    if self.files_read > MAX_FILES_READ:
      raise ValueError(f"{chain[-1]}: more than {MAX_FILES_READ} model gin files read (an "
                       f"include of {full} among them): an include tree that large is refused")
    text = files.read_text(full, MODEL_GIN_BYTES, "the model gin file").removeprefix("\ufeff")
    self.bytes_read += len(text)
    if self.bytes_read > MAX_BYTES_READ:
      raise ValueError(f"{full}: more than {MAX_BYTES_READ // files.MIB} MiB of model gin read "
                       f"through includes from {chain[0] if chain else full}: refused")
    for st in _gin_syntax.statements(text):
      where = f"{full}:{st.line}"
      if isinstance(st, _gin_syntax.Refused):
        raise _refused(where, f"it {st.why}")
      if isinstance(st, _gin_syntax.Import):
        self.imports += 1
      elif isinstance(st, _gin_syntax.Include):
        self.read(st.name, (*chain, full))
      elif isinstance(st, _gin_syntax.Macro):
        self.macros[st.name] = (_value(st.value, where, f"the macro {st.name}"), where)
      else:
        self._binding(st, where)
    return full

  def _binding(self, st: "_gin_syntax.Binding", where: str) -> None:
    name, field = st.configurable, st.field
    what = f"{name}.{field}"
    value = _value(st.value, where, what)
    if name in MODEL_NAMES:
      if st.scope:
        raise _refused(where, f"a scoped binding ({st.scope}/...); the main job reads a model "
                       "file under target/ or draft/ itself")
      cls = MODEL_NAMES[name]
      if self.cls not in (None, cls):
        raise ValueError(f"{where}: binds {name} in a file that binds {self.cls}; a model gin "
                         "file describes one model")
      self.cls = cls
      self.decoder_only_t5x |= name == "TransformerConfig"
      allowed = {f.name for f in dataclasses.fields(MODEL_CLASSES[cls])}
      if field not in allowed and field in NOT_DECODING:
        self.skipped[f"{what} ({NOT_DECODING[field]})"] = None
      elif field not in allowed:
        raise ValueError(f"{where}: {name} has no field {field!r} (fields: {sorted(allowed)})")
      else:
        self.fields[field] = (value, where, what)
    elif name == "DecoderOnlyModel" and field == "inputs_bidirectional_attention":
      self.model_flags[field] = (value, where, what)
    elif name == "SentencePieceVocabulary" and field in VOCABULARY_FIELDS:
      self.vocabulary[field] = (value, where, what)
    else:
      self.skipped[st.selector if not st.scope else f"{st.scope}/{st.selector}"] = None

  def resolved(self, value: Any, where: str, what: str, used: Dict[str, None]) -> Any:
    """`value` with a `%MACRO` followed to its literal (`used` collects the macros); errors
    name the field's line, and the macro's."""
    via = ""
    while isinstance(value, _gin_syntax.MacroRef):
      macro = value.name
      if macro == "gin.REQUIRED":
        raise ValueError(f"{where}: {what} is %gin.REQUIRED{via} (a T5X run file binds it): "
                         "bind it in the model gin file, or bind the field itself")
      if used.get(macro) == what:
        raise ValueError(f"{where}: {what}: the macro {macro} refers to itself")
      if macro not in self.macros:
        raise ValueError(f"{where}: {what} = %{macro}, and no model gin file binds the macro "
                         f"{macro}: bind it there ({macro} = ...) or bind the field itself")
      used[macro] = what
      value, macro_where = self.macros[macro]
      via = f" through %{macro} ({macro_where})"
    if not _gin_syntax.is_literal(value):
      raise ValueError(f"{where}: the value of {what}{via} must be a literal (a number, string, "
                       "bool, None, or a tuple/list/dict of them), not a reference")
    return value

  def result(self, path: str) -> ModelFile:
    if self.cls is None:
      raise ValueError(f"model gin file '{path}' binds none of {_CLASS_NAMES} "
                       "(T5X: network.T5Config, network.TransformerConfig)")
    used: Dict[str, None] = {}
    values = {f: self.resolved(v, w, what, used) for f, (v, w, what) in self.fields.items()}
    if self.cls == "DecoderOnlyConfig":
      for f, (v, w, what) in self.model_flags.items():
        values.setdefault(f, self.resolved(v, w, what, used))
      if self.decoder_only_t5x:
        values.setdefault("prompt_convention", "t5x")
    else:
      self.skipped.update({what: None for _, _, what in self.model_flags.values()})
    vocabulary = self._vocabulary(used)
    skipped = [f"{self.imports} import(s)"] if self.imports else []
    unused = [m for m in self.macros if m not in used]
    skipped += [f"macro(s) {', '.join(unused)}"] if unused else []
    return ModelFile(path=path, cls=self.cls, values=values, vocabulary=vocabulary,
                     skipped=(*skipped, *self.skipped))

  def _vocabulary(self, used: Dict[str, None]) -> Optional[Dict[str, Any]]:
    found = {}
    for field, (value, where, what) in self.vocabulary.items():
      try:
        found[field] = self.resolved(value, where, what, used)
      except ValueError:  # %gin.REQUIRED or a reference: the run must name a vocabulary
        self.skipped[f"{what} (not a literal)"] = None
    model_file = found.get("sentencepiece_model_file")
    if not isinstance(model_file, str):
      return None
    extra_ids = found.get("extra_ids") or 0
    if (not isinstance(extra_ids, int) or isinstance(extra_ids, bool) or extra_ids < 0
        or extra_ids > MAX_EXTRA_IDS):
      raise ValueError(f"{self.vocabulary['extra_ids'][1]}: SentencePieceVocabulary.extra_ids "
                       f"must be a count in [0, {MAX_EXTRA_IDS}], got {extra_ids!r}")
    return {"sentencepiece_model_file": model_file, "extra_ids": extra_ids}


def _value(text: str, where: str, what: str) -> Any:
  try:
    return _gin_syntax.gin_value(text)
  except ValueError as e:
    raise ValueError(f"{where}: the value of {what} must be a literal (number, string, bool, "
                     f"None, or a tuple/list/dict of them), a %MACRO or a reference: {e}"
                     ) from e


def read_model_file(path: str, resolve: Resolver = resolve_local, roots: Sequence[str] = ()
                    ) -> ModelFile:
  """Reads a model gin file without gin, in T5X's syntax as in specjax's own.

  A model gin file may come with downloaded weights, so nothing in it runs: imports are
  skipped (never imported), configurables are never called, values are literals read with
  `ast`. Read: `include`s (found by `resolve`), `NAME = value` macros, and bindings of the
  model's config: `network.T5Config.<field> = <value>` (any module prefix, or none) and
  `network.T5Config:` blocks; `TransformerConfig` (T5X's decoder-only network) and
  specjax's `DecoderOnlyConfig`, `FeatureHeadConfig` alike. A value is a literal or a
  `%MACRO` whose binding is one. Kept besides: T5X's `models.DecoderOnlyModel.
  inputs_bidirectional_attention` and `seqio.SentencePieceVocabulary.sentencepiece_model_file`
  / `extra_ids` (the file's vocabulary). Skipped, and listed in `ModelFile.skipped`: every
  other binding (MODEL, OPTIMIZER, `adafactor.Adafactor:` ...), unused macros
  (`DROPOUT_RATE = %gin.REQUIRED`), T5X fields that do not change a decode (`dropout_rate`).
  Refused: scoped model bindings, references in a model field, lines that are not gin.
  Later bindings win, as in gin.

  Files are read only when they are regular files of at most MODEL_GIN_BYTES;
  an include must lie in `roots` or the folder of `path` (nothing else on the
  machine is read), at most MAX_INCLUDE_DEPTH deep and without a cycle.
  Messages name the file and line, never the text of a line.

  Args:
    path: the file.
    resolve: finds it and its includes (`resolve_local`: beside the including file;
      `specjax.app.gin_config` passes one that also searches the gin paths).
    roots: folders besides the model's own that includes may come from (the gin
      search paths).
  Raises:
    ValueError: naming the file, line and what is wrong.
    FileNotFoundError: the file or an include is not found.
  """
  reader = _Reader(resolve, tuple(roots))
  reader.read(path, ())
  return reader.result(path)


def parse_model_file(path: str, resolve: Resolver = resolve_local, roots: Sequence[str] = ()
                     ) -> Tuple[str, Dict[str, Any]]:
  """(class name, {field: value}) of a model gin file (`read_model_file`)."""
  found = read_model_file(path, resolve, roots)
  return found.cls, found.values


def config_from_model_file(path: str, resolve: Resolver = resolve_local,
                           roots: Sequence[str] = ()) -> Any:
  """The T5Config / DecoderOnlyConfig a model gin file describes (`parse_model_file`)."""
  cls, values = parse_model_file(path, resolve, roots)
  try:
    return MODEL_CLASSES[cls](**values)
  except (TypeError, ValueError) as e:
    raise ValueError(f"model gin file '{path}': {e}") from e


def read_model_gin(path: str) -> Any:
  """The model config a `model.gin` describes, read with the restricted parser.

  The grammar of `read_model_file`, includes found beside the including file: nothing is
  imported, registered or evaluated.

  Args:
    path: a model.gin file, or the folder that holds one.
  Returns:
    A DecoderOnlyConfig or T5Config.
  Raises:
    ValueError naming the offending line, or a field the class does not accept.
  """
  if files.is_remote(path) and not _remote().exists(path):
    path = _remote().join(path, MODEL_GIN)  # a gs:// model folder
  elif os.path.isdir(path):
    path = os.path.join(path, MODEL_GIN)
  return config_from_model_file(path)
