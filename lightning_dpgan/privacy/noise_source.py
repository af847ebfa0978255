"""``NoiseSource``: where a private mechanism's random draws come from.

DP noise protects only against someone who cannot replay it. If the noise came from torch's
global generator, which ``--seed`` seeds for reproducible initial weights and which
``config.yaml`` records, anyone holding the seed could redraw the noise and subtract it from
what was released; the same holds for DP-SGD's Poisson batch draws, whose secrecy the
subsampling amplification assumes. So every mechanism draws from a ``torch.Generator`` of its
own, seeded with 63 bits from the operating system's entropy pool (``secrets``), one generator
per device the draws are made on.

A fixed ``seed`` makes the draws reproducible: for tests and audits only. The privacy report
says which kind a run used. Under DDP a seeded source adds the rank to the seed, so ranks that
draw (DP-SGD's Poisson batches of each rank's shard) never share a stream; a resumed run's
seeded source (:meth:`NoiseSource.continue_after`) derives its seed from the steps already
taken too, so it does not draw the first segment's noise and batches a second time.

This is not a cryptographically secure generator (Opacus' ``secure_mode`` needs torchcsprng,
which does not build against current torch): the draws are Philox / Mersenne Twister outputs
from a secret seed, the common practice of DP libraries outside their secure modes.
"""
from __future__ import annotations

import hashlib
import secrets

import torch

from lightning_dpgan.distributed import rank


#: How a report names a secret draw made from a fixed seed (a segment's ``noise_source``, GS-WGAN's
#: ``selection_source``): ``fixed_seed_sources`` finds it there, and ``train``, ``sample`` and
#: ``evaluate`` flag such a run as not for release.
FIXED_SEED = "FIXED SEED"


def fixed_seed_sources(segments: list[dict] | None) -> list[str]:
    """The secret draws of ``segments`` (a strategy's, a checkpoint's or privacy.json's) that came
    from a fixed seed, each as "from step S: <source>": anyone with the seed (config.yaml
    records it) can replay them, so the run's epsilon does not hold against them."""
    return [f"from step {segment.get('from_step')}: {value}" for segment in segments or [] if isinstance(segment, dict)
            for key, value in segment.items()
            if key.endswith("_source") and isinstance(value, str) and value.startswith(FIXED_SEED)]


def fixed_seed_sources_in_report(privacy: dict) -> list[str]:
    """:func:`fixed_seed_sources` of a privacy.json: its ``segments`` after a resume, else its
    top-level ``noise_source`` (and GS-WGAN's ``selection_source``)."""
    segments = privacy.get("segments") or [{"from_step": 0, **{key: value for key, value in privacy.items()
                                                              if key.endswith("_source")}}]
    return fixed_seed_sources(segments if isinstance(segments, list) else [])


def not_for_release(sources: list[str]) -> str:
    """Why a run whose secret draws came from a fixed seed (``fixed_seed_sources``) is not for release."""
    return (f"its secret draws came from a fixed seed ({'; '.join(sources)}): anyone with the seed (a train run's "
            "config.yaml records it) can replay them, so its epsilon does not hold against them. For tests and audits "
            "only: release neither its synthetic data nor its checkpoint; train without the seed to release")


class NoiseSource:
    """Per-device ``torch.Generator`` s for one mechanism, seeded from OS entropy unless ``seed``
    is given (reproducible draws, tests only: not private)."""

    def __init__(self, seed: int | None = None) -> None:
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63):
            raise ValueError(f"--privacy.noise_seed must be an integer from 0 to 2**63 - 1, got {seed!r}")
        self.seed = seed
        #: training steps taken before this process's draws (a resume's): part of a fixed seed's stream
        self.steps_before = 0
        self._generators: dict[torch.device, torch.Generator] = {}

    @property
    def seeded(self) -> bool:
        return self.seed is not None

    def generator(self, device: torch.device | str = "cpu") -> torch.Generator:
        """The generator for draws on ``device``, made on first use."""
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if device not in self._generators:
            generator = torch.Generator(device=device)
            generator.manual_seed(self._initial_seed())
            self._generators[device] = generator
        return self._generators[device]

    def continue_after(self, steps: int) -> None:
        """Draw as the continuation of a run that took ``steps`` steps (a resume). A fixed seed
        then gives another stream than the first segment's (replaying it would add the same
        noise to other gradients, and draw the same batches); generators already made (DP-SGD's
        batch sampler holds one) are re-seeded in place. OS-entropy seeds are fresh anyway."""
        self.steps_before = int(steps)
        if self.seed is not None:
            for generator in self._generators.values():
                generator.manual_seed(self._initial_seed())

    def _initial_seed(self) -> int:
        if self.seed is None:
            return secrets.randbits(63)
        if not self.steps_before:
            return self.seed + rank()
        material = f"{self.seed}/{rank()}/{self.steps_before}".encode()
        return int.from_bytes(hashlib.sha256(material).digest()[:8], "big") >> 1

    def describe(self) -> str:
        """For the privacy report."""
        if self.seed is None:
            return "own generator seeded from OS entropy (not the run's --seed)"
        return f"{FIXED_SEED} {self.seed} (--privacy.noise_seed, for tests only: anyone with the seed can replay the noise)"


__all__ = ["FIXED_SEED", "NoiseSource", "fixed_seed_sources", "fixed_seed_sources_in_report", "not_for_release"]
