"""`python -m specjax.train --gin_file=...`: gin-configured training (the command is
`specjax.app.train_main`; the library is `specjax.train`)."""
from specjax.app.train_main import main

if __name__ == "__main__":
  main()
