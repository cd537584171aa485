"""`python -m specjax.data ...`: build the corpora and the vocabulary (see `specjax.data.corpora`)."""
import sys

from specjax import command
from specjax.data.corpora import main

if __name__ == "__main__":
  sys.exit(command.run_cli(main))
