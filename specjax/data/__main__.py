"""`python -m specjax.data ...`: build the corpora and the vocabulary (see `specjax.data.corpora`)."""
from specjax.data.corpora import main

if __name__ == "__main__":
  main()
