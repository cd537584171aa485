"""`python -m specjax.train --gin_file=...`: gin-configured training (see `specjax.train.trainer`)."""
from specjax.train.trainer import main

if __name__ == "__main__":
  main()
