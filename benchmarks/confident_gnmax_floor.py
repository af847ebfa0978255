"""Could Confident-GNMax's threshold rescue a PATE model with binary votes? Its floor, computed.

Confident-GNMax (G-PATE's aggregator) declines a query when the top vote count plus
N(0, sigma1^2) falls below a threshold T, and every check is charged lambda / (2 sigma1^2) RDP,
answered or not. This script finds the smallest sigma1 at which the *checks alone* fit the
budget (answers, which cost more, left out: a lower bound on the real cost), using the same
accountant as ``gpate`` (:class:`~lightning_dpgan.privacy.accountants.gnmax.ConfidentGNMaxAccountant`),
and then how well a threshold with that much noise tells apart the two kinds of binary vote:
unanimous (top count K) and an even split (top count K/2), with T halfway between them.

    python benchmarks/confident_gnmax_floor.py                    # PATE-CTGAN's Adult preset
    python benchmarks/confident_gnmax_floor.py --teachers 2000 --queries-per-step 64

A threshold that passes unanimous and split votes with similar probability cannot decline the
split queries cheaply, which is what the aggregator would be for.
"""
from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

from scipy.optimize import brentq
from scipy.stats import norm

from lightning_dpgan.privacy.accountants.gnmax import ConfidentGNMaxAccountant

NEVER_ANSWERED = 1e12  # sigma2 of queries that are never answered: it does not enter the cost


def least_sigma1(queries: int, epsilon: float, delta: float) -> float:
    """The smallest sigma1 at which ``queries`` threshold checks alone spend at most ``epsilon``."""
    accountant = ConfidentGNMaxAccountant("data-independent")

    def excess(sigma1: float) -> float:
        return accountant.epsilon_if_queries(delta, queries, sigma1, NEVER_ANSWERED, answered_fraction=0.0) - epsilon

    with warnings.catch_warnings():  # Opacus' note that the best order is at the grid's edge
        warnings.simplefilter("ignore", UserWarning)
        return brentq(excess, 1e-3, 1e9, xtol=1e-3)


def pass_probabilities(teachers: int, sigma1: float) -> tuple[float, float]:
    """P(pass) of a unanimous and of an evenly split binary vote, T halfway between them."""
    threshold = 0.75 * teachers
    unanimous = norm.sf(threshold, loc=teachers, scale=sigma1)
    split = norm.sf(threshold, loc=teachers / 2, scale=sigma1)
    return float(unanimous), float(split)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--teachers", type=int, default=200, help="K (PATE-CTGAN's Adult preset: 200)")
    parser.add_argument("--queries-per-step", type=int, default=64, help="labelled generated records per step")
    parser.add_argument("--steps", type=int, nargs="+", default=[1, 10, 100, 600])
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args()

    rows = []
    print(f"K = {args.teachers} teachers, {args.queries_per_step} queries per step, "
          f"epsilon {args.epsilon:g}, delta {args.delta:g}; T = 0.75 K")
    print("| steps | queries | least sigma1 | sigma1 / K | P(pass), unanimous | P(pass), even split |")
    print("|---|---|---|---|---|---|")
    for steps in args.steps:
        queries = steps * args.queries_per_step
        sigma1 = least_sigma1(queries, args.epsilon, args.delta)
        unanimous, split = pass_probabilities(args.teachers, sigma1)
        rows.append({"steps": steps, "queries": queries, "sigma1": sigma1, "sigma1_over_k": sigma1 / args.teachers,
                     "pass_unanimous": unanimous, "pass_split": split})
        print(f"| {steps} | {queries} | {sigma1:.1f} | {sigma1 / args.teachers:.2f} | {unanimous:.3f} | {split:.3f} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"arguments": vars(args), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
