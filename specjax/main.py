"""`python -m specjax.main`: the main job's command (`specjax.app.main.cli`; the `specjax`
console command is the same). The job itself lives in `specjax.app`."""
import sys

from specjax.app.main import cli

if __name__ == "__main__":
  sys.exit(cli())
