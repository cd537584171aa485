"""`python -m specjax.train --gin_file=...`: gin-configured training (the command is
`specjax.app.train_main`; the library is `specjax.train`)."""
import sys

from specjax.app.train_main import cli

if __name__ == "__main__":
  sys.exit(cli())
