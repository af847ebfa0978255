"""What a resolved preset (``lightning_dpgan.config.resolve``) plans to spend before training, read
from its options alone: production reads it from ``datamodule.privacy_cost()``, which needs the rows."""


def modes_epsilon(config: dict) -> float:
    """Epsilon of the modes' DP histogram: nothing with modes from public bounds (no row read) or
    without a histogram (min-max models list no ``modes_epsilon``), else ``data.modes_epsilon``."""
    data = config["data"]
    if data.get("modes") == "bounds":
        return 0.0
    return float(data.get("modes_epsilon") or 0.0)
