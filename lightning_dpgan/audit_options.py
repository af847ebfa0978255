"""The ``audit`` command's own options, apart from the audit itself.

:mod:`lightning_dpgan.canary_audit` imports torch and Lightning; the command line parses these
first, so ``audit --help`` and a mistyped option of its own answer before either loads.
"""
from __future__ import annotations

import argparse

DEFAULT_TRIALS = 20
DEFAULT_SAMPLES = 2000
#: Below this confidence a sound mechanism is often called a violation (at 0.5, a randomized
#: response exactly at its ε = 1 with 50 trials per side is, about one audit in thirteen; at
#: ε = 2, one in ten).
MIN_CONFIDENCE = 0.9


def audit_parser() -> argparse.ArgumentParser:
    from lightning_dpgan.cli import command_parser

    parser = command_parser(
        "audit",
        "Empirical privacy audit: re-train the model TRIALS times, half of them with a canary "
        "record, test the released generator for the canary and bound epsilon from below "
        "(writes audit.json). Every other argument is a train flag or dotted override.",
        allow_abbrev=False,
    )
    parser.add_argument("--trials", type=int, default=DEFAULT_TRIALS, help=f"counted trials, even (default {DEFAULT_TRIALS})")
    parser.add_argument("--confidence", type=float, default=0.95,
                        help=f"confidence of the Clopper-Pearson bound, in [{MIN_CONFIDENCE}, 1) (default 0.95)")
    parser.add_argument("--calibration-trials", dest="calibration_trials", type=int,
                        help="extra trials that choose the threshold and are not counted, even "
                             "(default: half the counted trials rounded down to an even number, at least 2)")
    parser.add_argument("--threshold", type=float,
                        help="fix the decision threshold in advance (distance); skips calibration")
    parser.add_argument("--samples", type=int, default=DEFAULT_SAMPLES,
                        help=f"records drawn per trial for the test (default {DEFAULT_SAMPLES})")
    return parser
