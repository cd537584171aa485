"""The paper's theory: Table 1 and Figures 2-4 (Leviathan et al. 2023, §3).

  python -m experiments.paper.table1 [--gin_file=experiments/table1.gin] [--output_dir=DIR]

Table 1: for each (α, γ), the expected factor of arithmetic operations (Thm 3.11, ĉ)
and of walltime speed (Thm 3.8, c); the paper prints c = ĉ = 0. Figures:
- figure2.png: expected tokens per round (Eq. 1) vs α, for several γ;
- figure3.png: the optimal γ vs α (§3.5), for several c;
- figure4.png: speed and operations factors vs α, for several γ at one (c, ĉ).
No model is run: the numbers are exact functions of (α, γ, c, ĉ).
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import gin
import numpy as np

from experiments.common.cli import Cli, cli_main
from experiments.common.output import Output, markdown_table
from specjax import analysis
from specjax.command import run_cli

PAPER_ROWS = ((0.6, 2), (0.7, 3), (0.8, 2), (0.8, 5), (0.9, 2), (0.9, 10))
FAST: Dict = {}  # nothing to run: the full table is already instant


@gin.configurable(module="table1")
def run(cli: Cli, *, rows: Sequence[Tuple[float, int]] = PAPER_ROWS, c: float = 0.0,
        c_hat: float = 0.0, fig2_gammas: Sequence[int] = (1, 3, 5, 7, 10),
        fig3_costs: Sequence[float] = (0.01, 0.05, 0.1, 0.2, 0.5),
        fig4_gammas: Sequence[int] = (1, 3, 5, 7, 10), fig4_c: float = 0.05,
        fig4_c_hat: float = 1.0) -> List[Dict]:
  """Writes table1.{md,csv,json} and figure{2,3,4}.png; returns the table rows.

  Args:
    cli: from `experiments.common.cli.parse_cli` (only output_dir is used).
    rows: (α, γ) pairs of the table (default: the paper's six).
    c, c_hat: the cost coefficients of the table (paper: 0 and 0).
    fig2_gammas: curves of Figure 2; fig3_costs: curves of Figure 3;
    fig4_gammas, fig4_c, fig4_c_hat: curves and costs of Figure 4.
  """
  out = Output(cli.output_dir, "table1")
  table = []
  for alpha, gamma in rows:
    table.append({"alpha": alpha, "gamma": gamma,
                  "operations": round(float(analysis.operations_factor(alpha, gamma, c_hat)), 2),
                  "speed": round(float(analysis.walltime_improvement(alpha, gamma, c)), 2),
                  "expected_tokens": round(float(analysis.expected_tokens(alpha, gamma)), 3),
                  "optimal_gamma_at_c": int(analysis.optimal_gamma(alpha, max(c, 1e-9), 64))})
  md = ["# Table 1: expected improvement factors (Thm 3.8 speed, Thm 3.11 operations)", "",
        f"c = {c}, ĉ = {c_hat} (the paper's Table 1 uses 0 and 0).", "",
        markdown_table(table, ["alpha", "gamma", "operations", "speed"]), "",
        "Figures: figure2.png (expected tokens vs α), figure3.png (optimal γ vs α), "
        "figure4.png (speed and operations vs α)."]
  out.markdown("\n".join(md))
  out.csv(table)
  out.json({"c": c, "c_hat": c_hat, "rows": table})
  _figures(out, fig2_gammas, fig3_costs, fig4_gammas, fig4_c, fig4_c_hat)
  print("\n".join(md))
  out.announce()
  return table


def _figures(out: Output, fig2_gammas, fig3_costs, fig4_gammas, c, c_hat) -> None:
  alphas = np.linspace(0.0, 0.99, 100)
  with out.figure("figure2.png", (5, 4)) as ax:
    for g in fig2_gammas:
      ax.plot(alphas, analysis.expected_tokens(alphas, g), label=f"γ={g}")
    ax.plot(alphas, 1 / (1 - alphas), "k--", label="γ=∞")
    ax.set(xlabel="α", ylabel="expected tokens per iteration", ylim=(1, 12),
           title="Figure 2: E[#tokens] (Eq. 1)")
    ax.legend()

  with out.figure("figure3.png", (5, 4)) as ax:
    for cost in fig3_costs:
      ax.step(alphas, analysis.optimal_gamma(alphas, cost, 64), where="mid", label=f"c={cost}")
    ax.set(xlabel="α", ylabel="optimal γ", yscale="log", title="Figure 3: optimal γ (§3.5)")
    ax.legend()

  with out.figure("figure4.png", (9, 4), ncols=2) as (left, right):
    for g in fig4_gammas:
      left.plot(alphas, analysis.walltime_improvement(alphas, g, c), label=f"γ={g}")
      right.plot(alphas, analysis.operations_factor(alphas, g, c_hat), label=f"γ={g}")
    left.set(xlabel="α", ylabel="speed improvement", title=f"Figure 4: speed (c={c})")
    right.set(xlabel="α", ylabel="arithmetic operations factor",
              title=f"Figure 4: operations (ĉ={c_hat})")
    left.legend()
    right.legend()


main = cli_main(run, "table1", __doc__, FAST, needs_pairs=False, weights_dtype=None)


if __name__ == "__main__":
  raise SystemExit(run_cli(main))  # a user's error: one line, exit 2
