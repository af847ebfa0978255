"""A large private CSV through the data path: wall time and peak memory of each stage before
training (reading and splitting, the DP mode histograms and their mixture fits, the
mode-specific encoding), for a table made here of ``--rows`` rows.

    python benchmarks/large_table.py                  # 1,000,000 rows, a public schema file
    python benchmarks/large_table.py --rows 100000    # compare the growth with the rows

The table: ten skewed numeric columns, eight categorical ones of 5 to 300 categories, a ZIP-like
integer column and a binary label, all declared in a public schema file (no DP estimate), as a
DP-CTGAN run reads it (``--data.encoding mode-specific``, DP modes at epsilon 0.1). Peak memory
is the process's resident maximum after each stage (``ru_maxrss``): it only grows, so a stage's
figure is the largest the run has needed so far.
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from lightning_dpgan.datamodules.csv import CSVDataModule

CATEGORY_COUNTS = (5, 12, 30, 60, 100, 150, 200, 300)


def make_table(rows: int, seed: int = 0) -> tuple[pd.DataFrame, dict]:
    """The table and its public schema (bounds and category lists chosen here, not read off it)."""
    rng = np.random.default_rng(seed)
    frame, columns = {}, []
    for index in range(10):
        frame[f"amount{index}"] = np.minimum(rng.lognormal(3.0 + index / 5, 1.0, rows), 1e6).round(2)
        columns.append({"name": f"amount{index}", "kind": "continuous", "bounds": [0.0, 1e6], "source": "benchmark"})
    for index, count in enumerate(CATEGORY_COUNTS):
        categories = [f"c{value}" for value in range(count)]
        weights = 1.0 / np.arange(1, count + 1)
        frame[f"kind{index}"] = rng.choice(categories, rows, p=weights / weights.sum())
        columns.append({"name": f"kind{index}", "kind": "categorical", "categories": categories, "source": "benchmark"})
    frame["zip"] = rng.integers(10000, 99999, rows)
    columns.append({"name": "zip", "kind": "integer", "bounds": [10000, 99999], "source": "benchmark"})
    frame["label"] = rng.choice(["no", "yes"], rows, p=[0.8, 0.2])
    columns.append({"name": "label", "kind": "categorical", "categories": ["no", "yes"], "source": "benchmark"})
    return pd.DataFrame(frame), {"label": "label", "label_kind": "binary", "columns": columns}


def peak_megabytes() -> float:
    """The process's largest resident size so far (Linux reports kilobytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed(stages: list[dict], name: str, work) -> None:
    start = time.perf_counter()
    work()
    stages.append({"stage": name, "seconds": round(time.perf_counter() - start, 2), "peak_mb": round(peak_megabytes())})


def measure(rows: int, folder: Path, seed: int = 0) -> dict:
    frame, schema = make_table(rows, seed)
    csv, schema_file = folder / "table.csv", folder / "schema.yaml"
    frame.to_csv(csv, index=False)
    schema_file.write_text(yaml.safe_dump(schema))
    del frame
    datamodule = CSVDataModule(csv=csv, schema=schema_file, encoding="mode-specific", modes="dp", modes_epsilon=0.1,
                               batch_size=500)
    stages: list[dict] = []
    timed(stages, "read and split", datamodule.training_row_count)
    timed(stages, "DP modes and encoding (setup)", lambda: datamodule.setup("fit"))
    records, width = datamodule.train_dataset.tensors[0].shape
    return {"rows": rows, "training_rows": int(records), "encoded_width": int(width), "stages": stages}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        result = measure(args.rows, Path(folder), args.seed)
    for stage in result["stages"]:
        print(f"{stage['stage']:<32} {stage['seconds']:>8.2f} s   peak {stage['peak_mb']:>8.0f} MB")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
