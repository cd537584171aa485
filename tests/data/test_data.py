"""Tests for specjax.data (parsing, cleaning, grouping, splits) and specjax.vocab."""
import json
import struct
import zipfile
from pathlib import Path

import pytest
import sentencepiece as spm

from specjax.data import corpora as data
from specjax.data import load_bundled
from specjax.data import vocab as vocab_lib

DDTP_EN = """\
Package: foo
Description-md5: 00000000000000000000000000000001
Description-en: frobnicate widgets quickly
 Foo frobnicates widgets in linear time and
 supports many widget formats.
 .
 Features:
   * fast
   * small

Package: foo-doc
Description-md5: 00000000000000000000000000000002
Description-en: frobnicate widgets quickly (documentation)
 Foo frobnicates widgets in linear time and
 supports many widget formats.
 .
 This package contains the manual.
"""

DDTP_DE = """\
Package: foo
Description-md5: 00000000000000000000000000000001
Description-de: Widgets schnell frobnizieren
 Foo frobniziert Widgets in linearer Zeit und
 unterstützt viele Widget-Formate.
 .
 Funktionen:
   * schnell
   * klein
"""


def _mo_bytes(pairs, order="<"):
  """A GNU .mo file holding (msgid, msgstr) string pairs."""
  pairs = sorted((a.encode(), b.encode()) for a, b in pairs)
  n = len(pairs)
  ids_at, strs_at = 28, 28 + 8 * n
  blob_at = strs_at + 8 * n
  blob, ids, strs = b"", [], []
  for table, index in ((ids, 0), (strs, 1)):
    for pair in pairs:
      table.append((len(pair[index]), blob_at + len(blob)))
      blob += pair[index] + b"\0"
  header = struct.pack(order + "7I", 0x950412DE, 0, n, ids_at, strs_at, 0, 0)
  tables = b"".join(struct.pack(order + "2I", *e) for e in ids + strs)
  return header + tables + blob


# ------------------------------------------------------------------- text helpers


def test_clean_text_and_normalize_key():
  assert data.clean_text(" a\tb\n c\u00a0d\u2028e \u00adf ") == "a b c d e f"
  assert data.clean_text("Datei…") == "Datei..."
  assert data.normalize_key("Open File…") == data.normalize_key("open  file")
  assert data.normalize_key("Größe!") == data.normalize_key("GRÖSSE") == "grösse"
  assert data.normalize_key("...") == ""


def test_split_of_is_deterministic_and_proportional():
  splits = [data.split_of(f"group{i}", 0.1) for i in range(4000)]
  assert splits == [data.split_of(f"group{i}", 0.1) for i in range(4000)]
  assert 300 < splits.count("test") < 500
  assert 300 < splits.count("validation") < 500
  with pytest.raises(ValueError, match="heldout_fraction"):
    data.split_of("x", 0.6)


# --------------------------------------------------------------------------- DDTP


def test_parse_ddtp_snippet():
  foo, doc = data.parse_ddtp(DDTP_EN)
  assert (foo.package, foo.md5, foo.lang) == ("foo", "0" * 31 + "1", "en")
  assert foo.synopsis == "frobnicate widgets quickly"
  assert foo.paragraphs == (
      "Foo frobnicates widgets in linear time and supports many widget formats.",
      "Features: * fast * small")
  assert doc.paragraphs[1] == "This package contains the manual."
  (de,) = data.parse_ddtp(DDTP_DE)
  assert de.lang == "de" and de.synopsis == "Widgets schnell frobnizieren"


@pytest.mark.parametrize("text, match", [
    ("Package: foo\nDescription-en: x\n", "Description-md5"),
    (" orphan continuation\nPackage: foo\n", "continuation"),
    ("Package: foo\nno colon here\n", "Field: value"),
])
def test_parse_ddtp_rejects_malformed(text, match):
  with pytest.raises(ValueError, match=match):
    data.parse_ddtp(text)


@pytest.mark.parametrize("name, stem", [
    ("foo", "foo"), ("foo-dev", "foo"), ("foo-doc", "foo"), ("libfoo2", "foo"),
    ("libfoo2-dev", "foo"), ("python3-foo", "foo"), ("foo-data-common", "foo"),
    ("libfoo-1.0-0", "foo"), ("0ad-data", "0ad"), ("2048", "2048"), ("bar", "bar"),
])
def test_package_stem(name, stem):
  assert data.package_stem(name) == stem


def _record(package, first, extra="", synopsis=None, md5=None, lang="en"):
  paragraphs = (first,) + ((extra,) if extra else ())
  return data.DdtpRecord(package=package, md5=md5 or f"md5-{package}", lang=lang,
                         synopsis=synopsis or f"synopsis of {package} tool",
                         paragraphs=paragraphs)


def test_group_packages_links_stems_and_shared_paragraphs():
  shared = "Bar is a very fine program that does many useful things for you."
  records = [_record("foo", "Foo one two three four five six seven."),
             _record("libfoo1", "Library of foo one two three four five six."),
             _record("foo-doc", "Docs for foo one two three four five six."),
             _record("bar", shared), _record("baz-gui", shared),
             _record("qux", "Qux is unrelated to everything here, truly.")]
  groups = data.group_packages(records)
  assert groups["foo"] == groups["libfoo1"] == groups["foo-doc"] == "foo"
  assert groups["bar"] == groups["baz-gui"] == "bar"
  assert groups["qux"] == "qux"
  assert data.group_packages(records[::-1]) == groups


def test_ddtp_examples_tasks():
  en = data.parse_ddtp(DDTP_EN)
  de = data.parse_ddtp(DDTP_DE)
  out = data.ddtp_examples(en, de)
  # LM drops foo-doc: same first paragraph as foo (near-duplicate).
  assert [ex[0] for _, ex in out["lm_ddtp_en"]] == [" ".join(en[0].paragraphs)]
  assert sorted(ex[1] for _, ex in out["summarize_ddtp"]) == [
      "frobnicate widgets quickly", "frobnicate widgets quickly (documentation)"]
  pairs = [ex for _, ex in out["translate_en_de"]]
  assert pairs == [
      ("frobnicate widgets quickly", "Widgets schnell frobnizieren"),
      (en[0].paragraphs[0], "Foo frobniziert Widgets in linearer Zeit und "
                            "unterstützt viele Widget-Formate."),
      ("Features: * fast * small", "Funktionen: * schnell * klein")]
  assert {g for g, _ in out["summarize_ddtp"]} == {"ddtp:foo"}


def test_ddtp_examples_caps_families():
  intro = "Qt is a cross-platform application framework with many separate modules."
  en = [_record(f"qtmod{c}", intro, f"This package contains module {c}.") for c in "abcde"]
  out = data.ddtp_examples(en, [])
  assert len(out["lm_ddtp_en"]) == 1
  assert len(out["summarize_ddtp"]) == data.SUMMARIES_PER_INTRO == 3
  assert out["translate_en_de"] == []


# --------------------------------------------------------------- trans + gettext


def test_parse_trans_de_en():
  lines = [
      "# Version :: test\n",
      "Apfel {m} [bot.] | Das ist ein Apfel. | Ich esse gern Äpfel.; Äpfel mag ich. :: "
      "apple | That is an apple. | I like eating apples.\n",
      "laufen {vi} | Er läuft schnell. :: to run | He runs fast. | extra part\n",
      "Haus {n} | Das Haus ist alt. / ist sehr alt. :: house | The house is old [Br.].\n",
  ]
  out = data.parse_trans_de_en(lines)
  assert [ex for _, ex in out] == [
      ("That is an apple.", "Das ist ein Apfel."),
      ("I like eating apples.", "Ich esse gern Äpfel."),
      ("The house is old.", "Das Haus ist alt.")]
  assert out[0][0] == out[1][0] == "trans:apfel"
  with pytest.raises(ValueError, match="' :: '"):
    data.parse_trans_de_en(["no separator here\n"])


@pytest.mark.parametrize("order", ["<", ">"])
def test_read_mo(order):
  mo = _mo_bytes([("", "Content-Type: text/plain; charset=UTF-8\n"),
                  ("Open file", "Datei öffnen"),
                  ("menu\x04Save all", "Alle speichern"),
                  ("one file\x00many files", "eine Datei\x00viele Dateien"),
                  ("Untranslated", "")], order)
  assert sorted(data.read_mo(mo)) == [
      ("Open file", "Datei öffnen"), ("Save all", "Alle speichern"),
      ("many files", "viele Dateien"), ("one file", "eine Datei")]
  with pytest.raises(ValueError, match="magic"):
    data.read_mo(b"\0" * 40)


def test_gettext_examples_filters_and_accelerators():
  pairs = [("_Open File", "Datei ö_ffnen"), ("Print %s pages", "%s Seiten drucken"),
           ("Use {name} here", "Hier {name} verwenden"), ("<b>Bold</b> text", "<b>Fett</b>"),
           ("Quit", "Beenden"), ("Web Browser", "Web Browser"),
           ("&Move Here", "Hierher &verschieben"), ("Save ~All", "~Alle speichern")]
  got = [ex for _, ex in data.gettext_examples(pairs)]
  assert got == [("Open File", "Datei öffnen"), ("Move Here", "Hierher verschieben"),
                 ("Save All", "Alle speichern")]


# ------------------------------------------------------------------------- splits


def _synthetic_examples(n_groups=300):
  examples = []
  for g in range(n_groups):
    for k in range(3):
      examples.append((f"group{g}", (f"Source {g} number {k}.", f"Ziel {g} Nummer {k}.")))
  # The same normalized text under other groups must not leak across splits.
  examples += [(f"dup{g}", (f"source {g}  NUMBER 0", f"Anderes {g}")) for g in range(300)]
  examples += [(f"tdup{g}", (f"Other source {g}.", f"ziel {g} nummer 1")) for g in range(300)]
  return examples


def test_assign_splits_disjoint_grouped_deterministic():
  examples = _synthetic_examples()
  splits = data.assign_splits(examples, heldout_fraction=0.15)
  assert splits == data.assign_splits(examples, heldout_fraction=0.15)
  src = {s: [data.normalize_key(a) for a, _ in v] for s, v in splits.items()}
  tgt = {s: {data.normalize_key(b) for _, b in v} for s, v in splits.items()}
  for s in data.SPLITS:
    assert len(src[s]) == len(set(src[s])), f"duplicate sources in {s}"
    assert len(splits[s]) > 20
  for a, b in (("train", "validation"), ("train", "test"), ("validation", "test")):
    assert not set(src[a]) & set(src[b]), (a, b)
    assert not tgt[a] & tgt[b], (a, b)
  # All surviving examples of one group sit in the split of that group.
  where = {a: s for s, v in splits.items() for a, _ in v}
  for g in range(300):
    kept = [where[f"Source {g} number {k}."] for k in range(3)
            if f"Source {g} number {k}." in where]
    assert kept and set(kept) == {data.split_of(f"group{g}", 0.15)}


def test_write_read_split_roundtrip(tmp_path):
  pairs = [("a b", "c d"), ("Größe", "size")]
  data.write_split(tmp_path / "x.tsv", pairs)
  assert data.read_split(tmp_path / "x.tsv") == pairs
  data.write_split(tmp_path / "x.txt", [("doc one", None)])
  assert data.read_split(tmp_path / "x.txt") == [("doc one", None)]
  with pytest.raises(ValueError, match="tab/newline"):
    data.write_split(tmp_path / "y.tsv", [("a\tb", "c")])
  (tmp_path / "bad.tsv").write_text("only one field\n")
  with pytest.raises(ValueError, match="bad.tsv:1"):
    data.read_split(tmp_path / "bad.tsv")
  with pytest.raises(FileNotFoundError):
    data.read_split(tmp_path / "missing.tsv")


# -------------------------------------------------------------- prepare end to end


def _words(i, n=12):
  return " ".join(f"w{i}x{j}" for j in range(n))


def _name(i):
  """A package name without digits (a trailing number would be a soname)."""
  return "tool" + "".join(chr(ord("a") + int(d)) for d in str(i))


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
  root = tmp_path_factory.mktemp("prep")
  lists = root / "lists"
  lists.mkdir()
  en, de = [], []
  for i in range(80):
    body = f" {_name(i)} does {_words(i)}.\n .\n Second paragraph {_words(i + 1000, 4)}.\n"
    for suffix, extra in (("", ""), ("-dev", " .\n Development files.\n"),
                          ("-doc", " .\n The manual.\n")):
      en.append(f"Package: {_name(i)}{suffix}\nDescription-md5: {i}{suffix}\n"
                f"Description-en: synopsis of {_name(i)}{suffix}\n{body}{extra}")
    de.append(f"Package: {_name(i)}\nDescription-md5: {i}\nDescription-de: Werkzeug "
              f"{i} Kurzbeschreibung\n Werkzeug {_words(i + 2000)}.\n .\n Zweiter "
              f"Absatz {_words(i + 3000, 4)}.\n")
  (lists / "x_main_i18n_Translation-en").write_text("\n".join(en))
  (lists / "x_main_i18n_Translation-de").write_text("\n".join(de))
  trans = root / "de-en"
  trans.write_text("".join(f"Wort{i} | Satz {i} ist gut. :: word{i} | Sentence {i} is "
                           f"good.\n" for i in range(60)))
  wheels = root / "out" / "raw" / "wheels"
  wheels.mkdir(parents=True)
  with zipfile.ZipFile(wheels / "proj-1.0-py3-none-any.whl", "w") as z:
    z.writestr("proj/locale/de/LC_MESSAGES/django.mo", _mo_bytes(
        [(f"Open item {i}", f"Element {i} öffnen") for i in range(50)]))
  manifest = data.prepare(root / "out", heldout_fraction=0.15, no_fetch=True,
                          lists=lists, trans=trans)
  return root / "out", manifest


def test_prepare_writes_disjoint_grouped_splits(prepared):
  out, manifest = prepared
  assert manifest["sources"]["gettext"] == 50
  assert manifest["sources"]["trans_de_en"] == 60
  assert json.loads((out / "manifest.json").read_text()) == manifest
  splits_of_tool = {i: set() for i in range(80)}
  for task, ext in data.TASK_FILES.items():
    files = {s: data.read_split(out / task / f"{s}.{ext}") for s in data.SPLITS}
    assert {s: len(v) for s, v in files.items()} == manifest["splits"][task]
    assert all(files[s] for s in data.SPLITS), task
    keys = {s: {data.normalize_key(a) for a, _ in v} for s, v in files.items()}
    assert not keys["train"] & keys["validation"]
    assert not keys["train"] & keys["test"]
    assert not keys["validation"] & keys["test"]
    for split, exs in files.items():
      for src, tgt in exs:
        tokens = set(data.normalize_key(f"{src} {tgt or ''}").split())
        for i in range(80):
          if {_name(i), f"w{i}x0"} & tokens:
            splits_of_tool[i].add(split)
  # tool, tool-dev and tool-doc share one split, in every task.
  assert all(len(v) == 1 for v in splits_of_tool.values()), splits_of_tool
  assert len({s for v in splits_of_tool.values() for s in v}) == 3
  assert sum(manifest["splits"]["lm_ddtp_en"].values()) == 80  # -dev/-doc dropped
  assert sum(manifest["splits"]["summarize_ddtp"].values()) == 240
  assert sum(manifest["splits"]["translate_en_de"].values()) == 80 * 3 + 60 + 50


def test_make_bundle_and_cli(prepared, tmp_path):
  out, manifest = prepared
  data.main(["bundle", "--data", str(out), "--out", str(tmp_path)])
  got = data.read_split(tmp_path / "translate_en_de.tsv")
  want = data.read_split(out / "translate_en_de" / "validation.tsv")
  assert got and set(got) <= set(want)
  assert len(data.read_split(tmp_path / "lm_ddtp_en.txt")) == (
      manifest["splits"]["lm_ddtp_en"]["validation"])


def test_fetch_requires_root(monkeypatch, tmp_path):
  monkeypatch.setattr(data.os, "geteuid", lambda: 1000)
  with pytest.raises(PermissionError, match="root"):
    data.fetch(tmp_path)


# ------------------------------------------------------------- bundled + vocabulary


def test_bundled_split_sizes_and_types():
  lm = load_bundled("lm_ddtp_en")
  mt = load_bundled("translate_en_de")
  summ = load_bundled("summarize_ddtp")
  assert (len(lm), len(mt), len(summ)) == (1000, 1000, 500)
  assert all(isinstance(d, str) and len(d.split()) >= 10 for d in lm)
  assert all(s and t for s, t in mt + summ)
  assert len({s for s, _ in mt}) == len(mt)
  size = sum(p.stat().st_size for p in data.BUNDLED_DIR.iterdir())
  assert size <= 2 * 1024 * 1024
  with pytest.raises(ValueError, match="unknown task"):
    load_bundled("nope")


def test_bundled_vocab_conventions_and_roundtrip():
  v = vocab_lib.load_vocab()
  assert (v.vocab_size, v.pad_id, v.eos_id, v.unk_id) == (8192, 0, 1, 2)
  assert 250_000 < vocab_lib.DEFAULT_MODEL.stat().st_size < 600_000
  for src, tgt in load_bundled("translate_en_de")[:200]:
    for text in (src, tgt):
      ids = v.encode(text)
      assert ids and all(3 <= i < v.vocab_size for i in ids)
      assert v.decode(ids) == text
  ids = v.encode("Datei öffnen")
  assert v.decode(ids + [v.eos_id] + ids) == "Datei öffnen"
  assert v.decode([v.pad_id] + ids + [v.pad_id]) == "Datei öffnen"
  # Ids past the vocabulary (a model's vocab_size may be larger) read as UNK, as in seqio.
  assert v.decode(ids + [v.vocab_size, v.vocab_size + 100]) == v.decode(ids + [v.unk_id] * 2)
  assert "⁇" in v.decode([v.vocab_size])
  with pytest.raises(ValueError, match="outside"):
    v.decode([-1])
  # German is not split into characters: the vocabulary covers both languages.
  de = " ".join(t for _, t in load_bundled("translate_en_de")[:300])
  assert len(v.encode(de)) < 2.0 * len(de.split())


def test_train_vocab_small(tmp_path):
  lines = vocab_lib.balanced_sample(load_bundled("lm_ddtp_en")[:300],
                                    [t for _, t in load_bundled("translate_en_de")])
  model = vocab_lib.train_vocab(lines, tmp_path, vocab_size=300, model_name="tiny")
  v = vocab_lib.Vocab(model)
  assert (v.vocab_size, v.pad_id, v.eos_id, v.unk_id) == (300, 0, 1, 2)
  sp = spm.SentencePieceProcessor(model_file=str(model))
  assert (sp.id_to_piece(0), sp.id_to_piece(1), sp.id_to_piece(2)) == ("<pad>", "</s>", "<unk>")
  assert sp.bos_id() == -1
  assert v.decode(v.encode("Die Größe der Datei")) == "Die Größe der Datei"


def test_vocab_rejects_other_conventions(tmp_path):
  text = tmp_path / "t.txt"
  text.write_text("hello world\nhallo welt\n" * 50)
  spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(tmp_path / "m"),
                                 vocab_size=16, minloglevel=2)  # unk 0, bos 1, eos 2
  with pytest.raises(ValueError, match="pad=0 eos=1 unk=2"):
    vocab_lib.Vocab(tmp_path / "m.model")
  with pytest.raises(FileNotFoundError):
    vocab_lib.Vocab(tmp_path / "missing.model")
  with pytest.raises(ValueError, match="English and German"):
    vocab_lib.balanced_sample(["a"], [])
