"""The installed package must contain every source package (pyproject lists them by hand,
because callbacks/, datamodules/ and configs/ are mapped into lightning_dpgan)."""
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_every_package_directory_is_listed_in_pyproject():
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapping = setuptools["package-dir"]
    listed = set(setuptools["packages"])
    found = set()
    for package, directory in mapping.items():
        root = REPO / directory
        for init in root.rglob("__init__.py"):
            relative = init.parent.relative_to(root).parts
            name = ".".join((package, *relative))
            # a sub-directory that is itself mapped elsewhere belongs to that mapping
            if not any(name == other or name.startswith(other + ".") for other in mapping if other != package and len(other) > len(package)):
                found.add(name)
    assert found == listed, f"missing from pyproject: {sorted(found - listed)}; stale: {sorted(listed - found)}"
