"""Model x dataset presets (YAML) with the papers' hyper-parameters."""
