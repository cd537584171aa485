"""specjax's own gin files can never be shadowed, and a run's gin files cannot hang the job.

Each case as a user meets it: a folder of T5X model gin files passed with --gin_search_paths
(docs/own_t5x.md) that also holds a planted `runs/decode.gin` or `my_run.gin`, a working folder
with a `runs/` in it, a name found in two places, settings files that include a device, a
FIFO, each other, or each other many times over. A planted file imports a module that writes
a marker file, so "never run" is checked by the marker's absence, not by a message."""
import os
import threading

import gin
import pytest

from specjax.app import gin_config, gin_files
from specjax.app.main import DEFAULT_GIN, cli
from tests.test_hostile import _clear_gin  # pylint: disable=unused-import (autouse fixture)

TINY = "runs/random_tiny.gin"


@pytest.fixture
def planted(tmp_path, monkeypatch):
  """A module `specjax_planted` on sys.path that writes tmp_path/RAN when imported, and the
  gin text that imports it (what a hostile gin file does with `@os.system()`)."""
  marker = tmp_path / "RAN"
  (tmp_path / "specjax_planted.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  return marker, "import specjax_planted\nMAX_NEW_TOKENS = 999\n"


def _write(path, text):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(text)
  return path


def _parse(files, paths=(), bindings=()):
  gin_config.parse(gin_config.run_files(files, DEFAULT_GIN, paths), list(bindings), paths)


def test_a_search_path_folder_never_replaces_specjaxs_run_files(tmp_path, planted, monkeypatch):
  # Its runs/decode.gin replaced specjax's under every bundled run (`include
  # 'runs/decode.gin'`), and its import ran; exit 0, no warning.
  marker, text = planted
  models = _write(tmp_path / "t5x_models" / "runs" / "decode.gin", text).parent.parent
  monkeypatch.chdir(tmp_path)
  _parse([TINY], [str(models)])
  assert not marker.exists()
  assert gin_config.query_macro("MAX_NEW_TOKENS") != 999


def test_a_users_run_file_is_the_one_in_the_working_folder(tmp_path, planted, monkeypatch):
  # A planted my_run.gin in the search-path folder was read instead of ./my_run.gin.
  marker, text = planted
  _write(tmp_path / "models" / "my_run.gin", text)
  work = tmp_path / "work"
  _write(work / "my_run.gin", f"include '{TINY}'\nMAX_NEW_TOKENS = 7\n")
  monkeypatch.chdir(work)
  _parse(["my_run.gin"], [str(tmp_path / "models")])
  assert not marker.exists() and gin_config.query_macro("MAX_NEW_TOKENS") == 7
  os.remove(work / "my_run.gin")  # only in the search path: not found, and said why
  with pytest.raises(FileNotFoundError, match="holds model gin files only"):
    _parse(["my_run.gin"], [str(tmp_path / "models")])


def test_a_working_folder_with_runs_in_it_does_not_shadow_a_bundled_run(tmp_path, planted,
                                                                        monkeypatch):
  # gin looks in the working folder first: `--gin_file=runs/random_tiny.gin` ran a planted
  # ./runs/decode.gin.
  marker, text = planted
  _write(tmp_path / "runs" / "decode.gin", text)
  monkeypatch.chdir(tmp_path)
  _parse([TINY])
  assert not marker.exists() and gin_config.query_macro("MAX_NEW_TOKENS") != 999


def test_a_name_in_two_places_is_refused_in_one_line(tmp_path, planted, monkeypatch, capsys):
  marker, text = planted
  _write(tmp_path / TINY, text)  # ./runs/random_tiny.gin beside specjax's own
  monkeypatch.chdir(tmp_path)
  assert cli([f"--gin_file={TINY}", "--prompt", "x"]) == 2
  err = capsys.readouterr().err.strip()
  assert "\n" not in err and not marker.exists()
  assert f"gin file '{TINY}' is both {tmp_path / TINY} and {gin_files.GIN_DIR / TINY}" in err
  # The user's own file including a name that is both in the working folder and specjax's.
  os.remove(tmp_path / TINY)
  _write(tmp_path / "runs" / "decode.gin", text)
  _write(tmp_path / "mine.gin", "include 'runs/decode.gin'\n")
  with pytest.raises(ValueError, match="'runs/decode.gin' \\(included by .*mine.gin\\) is both"):
    _parse(["mine.gin"])
  assert not marker.exists()


@pytest.mark.parametrize("bad", ["/dev/zero", "fifo", "binary"])
def test_a_settings_file_including_a_device_a_fifo_or_binary_is_one_line(tmp_path, bad,
                                                                         monkeypatch):
  # /dev/zero was read whole; a FIFO blocked forever (specjax's own include scan); a binary
  # --gin_file's error named no file.
  monkeypatch.chdir(tmp_path)
  if bad == "fifo":
    os.mkfifo(tmp_path / "fifo")
  if bad == "binary":
    (tmp_path / "binary").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
  _write(tmp_path / "settings.gin", f"include '{bad}'\n")
  done = []

  def parse():
    with pytest.raises(ValueError) as e:
      _parse(["settings.gin"])
    done.append(str(e.value))
  worker = threading.Thread(target=parse, daemon=True)
  worker.start()
  worker.join(60)
  assert done, "the parse hung"
  named = "/dev/zero" if bad == "/dev/zero" else str(tmp_path / bad)
  assert named in done[0] and ("not a regular file" in done[0] or "not UTF-8" in done[0])


def test_files_including_each_other_are_one_line_not_a_recursion_error(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  _write(tmp_path / "a.gin", "include 'b.gin'\n")
  _write(tmp_path / "b.gin", "include 'a.gin'\n")
  for parse in (lambda: _parse(["a.gin"]), lambda: gin_config.parse(["a.gin"], [])):
    with pytest.raises(ValueError, match="gin include cycle: .*a.gin -> .*b.gin -> .*a.gin"):
      parse()


def test_files_that_include_each_other_many_times_are_bounded(tmp_path, monkeypatch):
  # 8 small files each including the next 10 times: 10**7 reads, the job hung.
  monkeypatch.chdir(tmp_path)
  for i in range(8):
    _write(tmp_path / f"f{i}.gin", f"include 'f{i + 1}.gin'\n" * 10)
  _write(tmp_path / "f8.gin", "GAMMA = 2\n")
  with pytest.raises(ValueError, match=f"more than {gin_files.MAX_FILES_READ} files read"):
    gin_config.parse(["f0.gin"], [])


def test_a_missing_search_path_and_a_byte_order_mark(tmp_path, monkeypatch):
  with pytest.raises(ValueError, match="--gin_search_paths: .*nowhere does not exist"):
    gin_config.parse([TINY], [], [str(tmp_path / "nowhere")])
  monkeypatch.chdir(tmp_path)
  _write(tmp_path / "bom.gin", f"\ufeffinclude '{TINY}'\nGAMMA = 3\n")
  gin_config.parse(["bom.gin"], [])
  assert gin.query_parameter("%GAMMA") == 3
