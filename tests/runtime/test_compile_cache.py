"""JAX's persistent compilation cache for specjax's commands: where it lives (flag, environment,
XDG default), that it can be turned off, and that a second identical run of the main job
compiles nothing (every executable comes from the cache). Runs start fresh processes: JAX
decides once per process whether it uses the cache."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specjax.runtime import compile_cache

ROOT = Path(__file__).resolve().parents[2]


def test_the_folder_follows_flag_then_environment_then_xdg(tmp_path):
  env = {"XDG_CACHE_HOME": str(tmp_path / "xdg"), "HOME": str(tmp_path / "home")}
  choose = compile_cache.choose_folder
  assert choose(environ=env) == tmp_path / "xdg" / "specjax" / "jax"
  assert choose(environ={"HOME": str(tmp_path)}) == Path.home() / ".cache" / "specjax" / "jax"
  assert choose(environ={**env, "JAX_COMPILATION_CACHE_DIR": "/j"}) == Path("/j")
  assert choose(environ={**env, compile_cache.ENV: "/s", "JAX_COMPILATION_CACHE_DIR": "/j"}) \
      == Path("/s")
  assert choose("/flag", environ={**env, compile_cache.ENV: "/s"}) == Path("/flag")
  assert choose(environ={**env, compile_cache.ENV: "off"}) is None
  assert choose("/flag", off=True, environ=env) is None


_JIT = ("import sys, jax, jax.numpy as jnp; from specjax.runtime import compile_cache; "
        "{enable}; print(jax.jit(lambda x: jnp.sin(x) * 3)(jnp.ones(7)).sum())")


def _python(code, env, cwd):
  environ = {k: v for k, v in os.environ.items()
             if k not in (compile_cache.ENV, "JAX_COMPILATION_CACHE_DIR", "XDG_CACHE_HOME")}
  environ.update(env, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
  return subprocess.run([sys.executable, *code], cwd=cwd, env=environ, capture_output=True,
                        text=True, timeout=240, check=True)


def _entries(folder):
  return sorted(p.name for p in Path(folder).glob("*")) if Path(folder).exists() else []


@pytest.mark.parametrize("enable,env,folder", [
    ("compile_cache.enable_from(None)", {"XDG_CACHE_HOME": "{tmp}/xdg"}, "xdg/specjax/jax"),
    ("compile_cache.enable_from(None)", {compile_cache.ENV: "{tmp}/mine"}, "mine"),
    ("compile_cache.enable(compile_cache.choose_folder('{tmp}/flag'))", {}, "flag"),
])
def test_a_compile_is_written_to_the_chosen_folder(tmp_path, enable, env, folder):
  env = {k: v.format(tmp=tmp_path) for k, v in env.items()}
  _python(["-c", _JIT.format(enable=enable.format(tmp=tmp_path))], env, tmp_path)
  assert _entries(tmp_path / folder), f"nothing cached in {folder}"


@pytest.mark.parametrize("enable,env", [
    ("compile_cache.enable(compile_cache.choose_folder(off=True))", {}),
    ("compile_cache.enable_from(None)", {compile_cache.ENV: "off"}),
    ("compile_cache.enable_for_module_run()", {}),  # `python -c`: not a module run
])
def test_the_cache_can_be_off(tmp_path, enable, env):
  env = {"XDG_CACHE_HOME": str(tmp_path / "xdg"), **env}
  _python(["-c", _JIT.format(enable=enable)], env, tmp_path)
  assert not _entries(tmp_path / "xdg" / "specjax" / "jax")


@pytest.mark.e2e
def test_a_second_identical_run_reads_every_executable_from_the_cache(tmp_path):
  cache = tmp_path / "cache"
  command = ["-m", "specjax.main", "--plain", "--gin_file=runs/random_tiny.gin", "--prompt",
             "Hello.", "--gin.MAX_NEW_TOKENS=6", "--gin.TIMING_REPEATS=1",
             f"--compilation_cache={cache}"]
  summaries = []
  for run in ("first", "second"):
    _python([*command, f"--gin.OUTPUT_DIR='{tmp_path / run}'"], {}, tmp_path)
    summaries.append(json.loads((tmp_path / run / "summary.json").read_text()))
    if run == "first":
      written = _entries(cache)
  assert len(written) > 2, written  # at least both decode loops
  assert _entries(cache) == written  # the second run compiled nothing new
  assert summaries[0]["speculative_tokens"] == summaries[1]["speculative_tokens"]


def _run_jit(folder, tmp_path, before=""):
  """A fresh process that compiles one function with the cache in `folder`; its stderr."""
  code = _JIT.format(enable=f"{before}compile_cache.enable(compile_cache.Path('{folder}'))")
  return _python(["-W", "always", "-c", code], {}, tmp_path).stderr


def _specjax_lines(stderr):
  return [line for line in stderr.splitlines() if "specjax" in line or "Warning" in line]


def test_only_folders_no_one_else_can_write_are_trusted(tmp_path):
  # JAX runs whatever executable sits under a key: a folder others can write runs their code.
  ours = tmp_path / "parent" / "cache"
  ours.mkdir(parents=True)
  assert compile_cache.untrusted(ours) is None
  ours.chmod(0o775)
  assert compile_cache.untrusted(ours) == f"{ours} is writable by its group"
  ours.chmod(0o757)
  assert compile_cache.untrusted(ours) == f"{ours} is writable by others"
  ours.chmod(0o755)
  ours.parent.chmod(0o777)
  assert compile_cache.untrusted(ours) == f"{ours.parent} is writable by others"
  ours.parent.chmod(0o1777)  # sticky, as /tmp: no one else can replace what is ours there
  assert compile_cache.untrusted(ours) is None
  ours.parent.chmod(0o755)
  assert compile_cache.untrusted(ours, uid=12345) is None  # root's folders are trusted (as ssh)
  os.chown(ours, 65534, 65534)
  assert compile_cache.untrusted(ours) == f"{ours} is owned by another user (uid 65534)"


def test_an_untrusted_folder_is_one_line_and_the_run_goes_on_uncached(tmp_path):
  shared = tmp_path / "shared"
  shared.mkdir()
  shared.chmod(0o777)
  stderr = _run_jit(shared, tmp_path)
  assert _specjax_lines(stderr) == [
      f"specjax: compilation cache off: {shared} is not safe to run compiled code from: "
      f"{shared} is writable by others"]
  assert not _entries(shared)


def test_entries_are_written_whole_and_never_through_a_planted_link(tmp_path):
  cache = tmp_path / "cache"
  _run_jit(cache, tmp_path)
  first = {p.name: p.stat().st_size for p in cache.iterdir()}
  names = sorted(first)
  assert len(names) >= 2, names
  # A dangling link under one entry's name (JAX wrote straight through it, creating the
  # target), an empty entry and a torn one (JAX warned about them on every run, never
  # repairing them).
  (cache / names[0]).unlink()
  (cache / names[0]).symlink_to(tmp_path / "victim")
  (cache / names[1]).write_bytes(b"")
  if len(names) > 2:
    (cache / names[2]).write_bytes((cache / names[2]).read_bytes()[:first[names[2]] // 2])
  stderr = _run_jit(cache, tmp_path)
  assert not _specjax_lines(stderr), stderr
  assert not (tmp_path / "victim").exists()
  assert {p.name: p.stat().st_size for p in cache.iterdir()} == first
  assert not any(p.is_symlink() for p in cache.iterdir())


def test_a_cache_that_cannot_be_written_says_so_once(tmp_path):
  # A full disk (here a file size limit) made JAX warn once per compiled function; a
  # read-only folder too.
  full = ("import resource, signal; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
          "resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64)); "
          "jnp.arange(3).sum(); jnp.ones(3).mean(); ")
  stderr = _run_jit(tmp_path / "full", tmp_path, before=full)
  lines = _specjax_lines(stderr)
  assert len(lines) == 1 and lines[0].startswith(
      f"specjax: compilation cache {tmp_path / 'full'} cannot be written ("), stderr
  stderr = _run_jit(tmp_path / "ro", tmp_path, before="compile_cache.os.access = "
                    "lambda *a, **k: False; ")
  assert _specjax_lines(stderr) == [
      f"specjax: compilation cache {tmp_path / 'ro'} is read-only for this user: compiled "
      "loops are read from it, none written"]
  assert not _entries(tmp_path / "ro")
