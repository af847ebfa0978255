"""Mode-specific normalization of one numeric column (CTGAN, Xu et al. 2019), fitted under DP.

CTGAN represents a value ``x`` of a multi-modal column by the mode ``k`` of a Gaussian mixture
it belongs to (a one-hot) and its position inside that mode, ``alpha = (x - mu_k) / (4 sigma_k)``
clipped to [-0.99, 0.99] (a tanh output); decoding is ``mu_k + 4 sigma_k alpha``. CTGAN fits the
mixture to the private values, which leaks (a component can sit on a single outlier). Here the
mixture is fitted to points drawn from a *differentially private histogram*
(:func:`~lightning_dpgan.data.dp_histogram.dp_column_histograms`): post-processing of a DP
release, so the modes cost nothing beyond that release. :meth:`ModeSpecificNormalizer.from_bounds`
reads no data at all: one mode spanning the public bounds, i.e. a min-max encoding.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from sklearn.exceptions import ConvergenceWarning
from sklearn.mixture import BayesianGaussianMixture

#: CTGAN's settings: a Dirichlet-process variational mixture of at most 10 components, of which
#: those with weight above 0.005 are kept as modes.
MAX_MODES = 10
WEIGHT_THRESHOLD = 0.005
CONCENTRATION_PRIOR = 0.001
#: Points drawn from the noisy histogram to fit the mixture to: a fixed number, so that how
#: many there are does not depend on the data.
HISTOGRAM_POINTS = 5000
#: More EM iterations than scikit-learn's default 100 (which CTGAN keeps): on a few thousand
#: points the variational fit has often not yet merged duplicate components after 100.
MAX_ITER = 1000
ALPHA_LIMIT = 0.99


class ModeSpecificNormalizer:
    """Modes ``(weight, mean, std)`` of one numeric column and the CTGAN map through them.

    Build it with :meth:`fit_histogram` (from a DP histogram) or :meth:`from_bounds` (public
    bounds only); modes are kept sorted by mean so the one-hot order is readable.
    """

    def __init__(self, means: Any, stds: Any, weights: Any | None = None) -> None:
        means = np.asarray(means, dtype=np.float64).reshape(-1)
        stds = np.asarray(stds, dtype=np.float64).reshape(-1)
        weights = np.full(len(means), 1.0 / max(len(means), 1)) if weights is None else np.asarray(weights, np.float64)
        if not len(means) or means.shape != stds.shape or weights.shape != means.shape:
            raise ValueError(f"modes need matching non-empty means, stds and weights, got {means}, {stds}, {weights}")
        if not (np.isfinite(means).all() and np.isfinite(stds).all() and (stds > 0).all()):
            raise ValueError(f"modes need finite means and positive stds, got {means}, {stds}")
        if not (np.isfinite(weights).all() and (weights >= 0).all() and weights.sum() > 0):
            raise ValueError(f"mode weights must be non-negative with a positive sum, got {weights}")
        order = np.argsort(means, kind="stable")
        self.means, self.stds = means[order], stds[order]
        total = weights.sum()
        # normalised once: a stored (already normalised) description reads back bit for bit
        self.weights = weights[order] if abs(total - 1.0) < 1e-12 else weights[order] / total

    @property
    def n_modes(self) -> int:
        return len(self.means)

    # --- construction ------------------------------------------------------------------------

    @classmethod
    def from_bounds(cls, low: float, high: float) -> ModeSpecificNormalizer:
        """One mode at the middle of ``[low, high]`` with std ``(high - low) / 8``, so that
        ``alpha`` runs from -1 to 1 across the bounds: a min-max encoding, and no data read."""
        if not high > low:
            raise ValueError(f"bounds need low < high, got {(low, high)}")
        return cls([(low + high) / 2.0], [(high - low) / 8.0], [1.0])

    @classmethod
    def fit_histogram(
        cls,
        edges: Any,
        noisy_counts: Any,
        max_modes: int = MAX_MODES,
        seed: int = 0,
        n_points: int = HISTOGRAM_POINTS,
    ) -> ModeSpecificNormalizer:
        """Fit CTGAN's variational mixture to a (noisy) histogram: post-processing only.

        Negative noisy counts are clipped to 0; ``n_points`` points are spread over the bins in
        proportion to the clipped counts (largest-remainder rounding) and drawn uniformly
        inside their bins, and the mixture is fitted to them in coordinates scaled to [0, 1]
        (the fit is then independent of the column's units). Modes of weight above 0.005 are
        kept. If noise leaves no positive count, one mode spans the edges
        (:meth:`from_bounds`). ``seed`` drives the draws and the fit; it need not be secret,
        since everything here is a function of the DP release.
        """
        edges = np.asarray(edges, dtype=np.float64)
        counts = np.clip(np.asarray(noisy_counts, dtype=np.float64), 0.0, None)
        if edges.ndim != 1 or len(edges) != len(counts) + 1 or not (np.diff(edges) > 0).all():
            raise ValueError(f"need increasing edges, one more than counts; got {len(edges)} edges, {len(counts)} counts")
        if isinstance(max_modes, bool) or not isinstance(max_modes, int) or max_modes < 1:
            raise ValueError(f"max_modes must be an integer >= 1, got {max_modes!r}")
        low, high = float(edges[0]), float(edges[-1])
        if counts.sum() <= 0:
            return cls.from_bounds(low, high)
        rng = np.random.default_rng(seed)
        unit = (_points_in_bins(edges, counts, n_points, rng) - low) / (high - low)
        mixture = _fit_mixture(unit, max_modes, seed)
        keep = mixture.weights_ > WEIGHT_THRESHOLD
        means = mixture.means_.reshape(-1)[keep] * (high - low) + low
        stds = np.sqrt(mixture.covariances_.reshape(-1)[keep]) * (high - low)
        return cls(means, stds, mixture.weights_[keep])

    # --- the map -----------------------------------------------------------------------------

    def posterior(self, values: Any) -> np.ndarray:
        """``P(mode k | x)`` under the kept modes, shape ``(n, n_modes)``."""
        x = np.asarray(values, dtype=np.float64).reshape(-1, 1)
        log_density = np.log(self.weights) - np.log(self.stds) - 0.5 * ((x - self.means) / self.stds) ** 2
        log_density -= log_density.max(axis=1, keepdims=True)
        density = np.exp(log_density)
        return density / density.sum(axis=1, keepdims=True)

    def transform(self, values: Any, uniforms: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """``(alpha, mode_index)`` of each value.

        The mode is sampled from the posterior over the kept modes, as CTGAN does, by inverting
        its distribution function at ``uniforms`` (one draw in [0, 1) per value; ``None`` takes
        the most probable mode instead). ``alpha`` is clipped to [-0.99, 0.99], the reach of a tanh.
        """
        x = np.asarray(values, dtype=np.float64).reshape(-1)
        probabilities = self.posterior(x)
        if uniforms is None:
            modes = probabilities.argmax(axis=1)
        else:
            uniforms = np.asarray(uniforms, dtype=np.float64).reshape(-1, 1)
            if len(uniforms) != len(x):
                raise ValueError(f"need one uniform draw per value: {len(uniforms)} for {len(x)}")
            cumulative = probabilities.cumsum(axis=1)
            modes = np.minimum((cumulative < uniforms * cumulative[:, -1:]).sum(axis=1), self.n_modes - 1)
        alpha = (x - self.means[modes]) / (4.0 * self.stds[modes])
        return np.clip(alpha, -ALPHA_LIMIT, ALPHA_LIMIT), modes.astype(np.int64)

    def inverse(self, alpha: Any, modes: Any) -> np.ndarray:
        """``mu_k + 4 sigma_k alpha``; ``modes`` are indices ``(n,)`` or one-hot/logits
        ``(n, n_modes)`` (argmax). ``alpha`` is clipped to [-1, 1] (a generator's tanh range)."""
        alpha = _numpy(alpha).reshape(-1)
        modes = _numpy(modes)
        if modes.ndim == 2:
            if modes.shape[1] != self.n_modes:
                raise ValueError(f"expected {self.n_modes} mode slots, got {modes.shape[1]}")
            modes = modes.argmax(axis=1)
        modes = modes.reshape(-1).astype(np.int64)
        if len(modes) != len(alpha) or (len(modes) and (modes.min() < 0 or modes.max() >= self.n_modes)):
            raise ValueError(f"need one mode index in [0, {self.n_modes}) per alpha")
        return self.means[modes] + 4.0 * self.stds[modes] * np.clip(alpha, -1.0, 1.0)

    # --- (de)serialisation -------------------------------------------------------------------

    def to_dict(self) -> dict[str, list[float]]:
        return {"means": self.means.tolist(), "stds": self.stds.tolist(), "weights": self.weights.tolist()}

    @classmethod
    def from_dict(cls, entry: Mapping[str, Any]) -> ModeSpecificNormalizer:
        return cls(entry["means"], entry["stds"], entry["weights"])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ModeSpecificNormalizer):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return f"ModeSpecificNormalizer(n_modes={self.n_modes}, means={np.round(self.means, 4).tolist()})"


def _points_in_bins(edges: np.ndarray, counts: np.ndarray, n_points: int, rng: np.random.Generator) -> np.ndarray:
    """``n_points`` points spread over the bins in proportion to ``counts``, uniform within each."""
    share = counts / counts.sum() * n_points
    per_bin = np.floor(share).astype(np.int64)
    remainder = n_points - per_bin.sum()
    per_bin[np.argsort(-(share - per_bin), kind="stable")[:remainder]] += 1
    bins = np.repeat(np.arange(len(counts)), per_bin)
    return edges[bins] + rng.random(len(bins)) * (edges[bins + 1] - edges[bins])


def _fit_mixture(points: np.ndarray, max_modes: int, seed: int) -> BayesianGaussianMixture:
    mixture = BayesianGaussianMixture(
        n_components=max_modes,
        weight_concentration_prior_type="dirichlet_process",
        weight_concentration_prior=CONCENTRATION_PRIOR,
        n_init=1,
        max_iter=MAX_ITER,
        random_state=seed,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        mixture.fit(points.reshape(-1, 1))
    return mixture


def _numpy(data: Any) -> np.ndarray:
    if isinstance(data, torch.Tensor):
        data = data.detach().cpu().double().numpy()
    return np.asarray(data, dtype=np.float64)
