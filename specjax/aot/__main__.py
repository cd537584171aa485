"""`python -m specjax.aot`: the deviceless compile report (`specjax.app.aot`)."""
import sys

from specjax.app.aot import cli

if __name__ == "__main__":
  sys.exit(cli())
