"""The benchmark harness: ``python -m lightning_dpgan benchmark --suite NAME [--quick]``.

- :mod:`~lightning_dpgan.benchmark.suites`: what each suite runs (models x datasets x epsilons x seeds);
- :mod:`~lightning_dpgan.benchmark.runner`: one cell, ``train`` then ``evaluate`` in their own processes;
- :mod:`~lightning_dpgan.benchmark.peers`: smartnoise-synth's synthesizers on the same protocol;
- :mod:`~lightning_dpgan.benchmark.speed`: the mechanism speed scripts;
- :mod:`~lightning_dpgan.benchmark.results`: the results file (machine, commit, commands, seeds, mean ± std);
- :mod:`~lightning_dpgan.benchmark.report`: ``RESULTS.md``'s generated section and plots.
"""
