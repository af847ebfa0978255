"""The packages' top-level names (``from lightning_dpgan.callbacks import DPSGD``): every model,
strategy and dataset ``train`` names is offered, each the class ``train`` builds, imported only
when first asked for."""
import importlib
import subprocess
import sys

import pytest

from lightning_dpgan import registry

PACKAGES = {"model": "lightning_dpgan.modules", "privacy": "lightning_dpgan.callbacks",
            "dataset": "lightning_dpgan.datamodules"}


@pytest.mark.parametrize("kind", sorted(PACKAGES))
def test_every_registered_class_of_the_package_is_offered_as_the_class_train_builds(kind):
    package = importlib.import_module(PACKAGES[kind])
    offered = 0
    for entry in registry.TABLES[kind].values():
        if entry.target is None or not entry.target.startswith(PACKAGES[kind] + "."):
            continue  # privacy "none"; QUAIL, which is not a LightningModule
        name = entry.target.rpartition(":")[2]
        assert name in package.__all__ and name in dir(package)
        assert getattr(package, name) is entry.load()
        offered += 1
    assert offered == {"model": 10, "privacy": 4, "dataset": 6}[kind]
    if kind == "model":  # QUAIL wraps a module and is not one: its own file offers it
        assert "QUAIL" not in package.__all__ and not hasattr(package, "QUAIL")


def test_the_budget_callback_and_the_base_classes_are_offered_too():
    from lightning_dpgan.callbacks import BudgetTooSmallError, PrivacyBudgetStopping, PrivacyStrategy
    from lightning_dpgan.callbacks.budget import PrivacyBudgetStopping as from_its_file
    from lightning_dpgan.datamodules import IDXImageDataModule, TabularDataModule
    from lightning_dpgan.datamodules.adult import AdultDataModule

    assert PrivacyBudgetStopping is from_its_file and issubclass(BudgetTooSmallError, ValueError)
    assert issubclass(registry.PRIVACY["dp-sgd"].load(), PrivacyStrategy)
    assert issubclass(AdultDataModule, TabularDataModule)
    assert issubclass(registry.DATASETS["mnist"].load(), IDXImageDataModule)


def test_a_name_the_package_does_not_offer_is_an_import_error():
    with pytest.raises(ImportError, match="DPSGDD"):
        exec("from lightning_dpgan.callbacks import DPSGDD", {})  # noqa: S102 -- the import statement itself
    with pytest.raises(AttributeError, match="has no attribute 'Adult'"):
        importlib.import_module("lightning_dpgan.datamodules").Adult


#: what a package loads with itself: the baselines the private models build on
EAGER = {"lightning_dpgan.modules.gan", "lightning_dpgan.modules.wgan"}


def test_importing_a_package_imports_no_strategy_model_or_dataset_until_one_is_asked_for():
    """A fresh interpreter: importing the three packages leaves every registered strategy's,
    private model's and dataset's file unimported (and the strategies' base and the budget callback);
    asking for ``DPSGD`` imports its file, and keeps it on the package."""
    files = sorted({entry.target.partition(":")[0] for table in registry.TABLES.values() for entry in table.values()
                    if entry.target is not None} - EAGER
                   | {"lightning_dpgan.callbacks.strategy", "lightning_dpgan.callbacks.budget"})
    script = ("import sys, lightning_dpgan.callbacks, lightning_dpgan.modules, lightning_dpgan.datamodules\n"
              f"files = {files!r}\n"
              "before = [name for name in files if name in sys.modules]\n"
              "from lightning_dpgan.callbacks import DPSGD\n"
              "print(before, 'lightning_dpgan.callbacks.dp_sgd' in sys.modules, "
              "'DPSGD' in vars(lightning_dpgan.callbacks))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[] True True"
    assert len(files) > 15 and "lightning_dpgan.modules.pategan" in files and "lightning_dpgan.datamodules.mnist" in files


def test_the_readme_names_every_class_the_packages_offer():
    """README's "From Python" lists the names; a model, strategy or dataset added to the registry
    must be listed there too."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    names = text.split("- The names:", 1)[1].split("\n- ", 1)[0]
    for kind, package in PACKAGES.items():
        for entry in registry.TABLES[kind].values():
            if entry.target is not None and entry.target.startswith(package + "."):
                assert f"`{entry.target.rpartition(':')[2]}`" in names, entry.target
