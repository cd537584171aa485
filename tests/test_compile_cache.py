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

from specjax import compile_cache

ROOT = Path(__file__).resolve().parent.parent


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


_JIT = ("import sys, jax, jax.numpy as jnp; from specjax import compile_cache; "
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
