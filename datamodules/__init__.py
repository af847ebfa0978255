"""LightningDataModules for the datasets users name with --dataset."""
