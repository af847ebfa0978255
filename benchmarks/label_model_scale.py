"""How QUAIL's DP label model scales with the table's rows: one epoch of its Poisson batches drawn
by Opacus' sampler (one uniform number a record, a batch) and by ``PoissonBatches`` (the same law
at a batch's cost), and one epoch of the label model's whole DP-SGD training as it runs now.

    python benchmarks/label_model_scale.py                         # 80,000 and 800,000 rows
    python benchmarks/label_model_scale.py --rows 1000000 --batch-size 256

The table: ``--features`` standard-normal columns and a binary label, made here. Each figure is
the seconds of one epoch (``int(1 / q)`` batches, ``q = batch / rows``, as both samplers count it).
"""
from __future__ import annotations

import argparse
import json
import time

import torch
from opacus.utils.uniform_sampler import UniformWithReplacementSampler

from lightning_dpgan.privacy.dp_label_model import DPSGDSettings, label_network, train_dp_label_model
from lightning_dpgan.privacy.poisson_batches import PoissonBatches


def seconds_to_draw(sampler) -> float:
    start = time.perf_counter()
    for _ in sampler:
        pass
    return time.perf_counter() - start


def measure(rows: int, batch_size: int, features: int) -> dict:
    rate = batch_size / rows
    generator = torch.Generator().manual_seed(0)
    opacus = seconds_to_draw(UniformWithReplacementSampler(num_samples=rows, sample_rate=rate, generator=generator))
    own = seconds_to_draw(PoissonBatches(rows, rate, generator))
    inputs = torch.randn(rows, features, generator=generator)
    labels = torch.nn.functional.one_hot((inputs[:, 0] > 0).long(), 2).float()
    start = time.perf_counter()
    train_dp_label_model(label_network("logistic", features, 2, []), inputs, labels, 1.0, 0.1 / rows,
                         DPSGDSettings(epochs=1, batch_size=batch_size), noise_seed=0)
    trained = time.perf_counter() - start
    return {"rows": rows, "batch_size": batch_size, "batches": int(1 / rate), "opacus_sampler_s": round(opacus, 2),
            "poisson_batches_s": round(own, 2), "label_model_epoch_s": round(trained, 2)}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[80_000, 800_000])
    parser.add_argument("--batch-size", type=int, default=256, help="QUAIL's default label-model batch")
    parser.add_argument("--features", type=int, default=20)
    args = parser.parse_args(argv)
    results = [measure(rows, args.batch_size, args.features) for rows in args.rows]
    for result in results:
        print(json.dumps(result))
    return results


if __name__ == "__main__":
    main()
