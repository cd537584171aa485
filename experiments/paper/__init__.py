"""The paper's tables and figure at this machine's scale: `python -m experiments.paper.NAME`."""
