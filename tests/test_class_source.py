"""--help reads registered classes from their source files: the same text as importing them, in
a fraction of a second (class_source.py)."""
import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lightning_dpgan import class_source, registry
from lightning_dpgan.argument_types import init_arguments

REPO = Path(__file__).resolve().parents[1]

REGISTERED = [(kind, name) for kind, table in registry.TABLES.items() for name, entry in table.items() if entry.target]


@pytest.mark.parametrize("kind, name", REGISTERED)
def test_every_registered_class_reads_from_source_as_it_imports(kind, name):
    """Each description and settings list comes from the source (not the import fallback) and
    equals what the imported class gives."""
    entry = registry.lookup(kind, name)
    module_name, _, attr = entry.target.partition(":")
    cls = entry.load()
    doc = (cls.__doc__ or "").strip()
    assert class_source.first_doc_line(module_name, attr) == (doc.splitlines()[0] if doc else "")
    assert class_source.constructor_arguments(module_name, attr) == list(init_arguments(cls))


def _fake_modules(monkeypatch, tmp_path, sources):
    """Write each ``lightning_dpgan.<name>`` module of ``sources`` to ``tmp_path``, have
    class_source find it there, and import it as well (to compare with)."""
    files = {}
    for name, text in sources.items():
        files[f"lightning_dpgan.{name}"] = tmp_path / f"{name}.py"
        files[f"lightning_dpgan.{name}"].write_text(textwrap.dedent(text))
    monkeypatch.setattr(class_source, "module_file", lambda module_name: files.get(module_name))
    class_source._parsed.cache_clear()
    modules = {}
    for module_name, path in files.items():  # in order: later modules import earlier ones
        spec = importlib.util.spec_from_file_location(module_name, path)
        modules[module_name] = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, module_name, modules[module_name])
        spec.loader.exec_module(modules[module_name])
    return modules


@pytest.fixture(autouse=True)
def _fresh_cache():
    class_source._parsed.cache_clear()
    yield
    class_source._parsed.cache_clear()


def test_kwargs_are_followed_in_method_resolution_order_across_modules(monkeypatch, tmp_path):
    """A diamond: D(B, C), B(A), C(A), each passing **kwargs on; Python's MRO is D, B, C, A."""
    modules = _fake_modules(monkeypatch, tmp_path, {
        "fake_base": """
            class A:
                '''The root.'''
                def __init__(self, a=1, *, shared=0):
                    pass
            """,
        "fake_child": """
            from lightning_dpgan.fake_base import A

            class B(A):
                def __init__(self, b=2, shared=5, **kwargs):
                    super().__init__(**kwargs)

            class C(A):
                '''

                C's summary, after a blank first line.
                More.
                '''
                def __init__(self, c=3, **kwargs):
                    super().__init__(**kwargs)

            class Mixin:
                pass

            class D(Mixin, B, C):
                def __init__(self, d=4, *args, **kwargs):
                    super().__init__(**kwargs)
            """,
    })
    d = modules["lightning_dpgan.fake_child"].D
    assert [klass.__name__ for klass in d.__mro__] == ["D", "Mixin", "B", "C", "A", "object"]
    assert class_source.constructor_arguments("lightning_dpgan.fake_child", "D") == list(init_arguments(d)) \
        == ["d", "b", "shared", "c", "a"]
    assert class_source.first_doc_line("lightning_dpgan.fake_child", "C") == "C's summary, after a blank first line."
    assert class_source.first_doc_line("lightning_dpgan.fake_child", "D") == ""  # not A's: __doc__ is not inherited


def test_what_the_source_cannot_settle_is_left_to_the_import(monkeypatch, tmp_path):
    """A **kwargs chain that reaches a class from outside this package, or a base made at run
    time, gives None; the registry then imports the class and reads the same from it."""
    _fake_modules(monkeypatch, tmp_path, {
        "fake_outside": """
            import argparse
            import dataclasses

            class Outside(argparse.ArgumentParser):
                def __init__(self, mine=1, **kwargs):
                    super().__init__(**kwargs)

            class Stops(argparse.ArgumentParser):
                '''Ends its chain itself.'''
                def __init__(self, mine=1):
                    super().__init__()

            Made = type("Made", (), {})

            class FromMade(Made):
                pass

            @dataclasses.dataclass
            class Fields:
                size: int = 1

            class Assigned:
                __init__ = Fields.__init__
            """,
    })
    assert class_source.constructor_arguments("lightning_dpgan.fake_outside", "Outside") is None
    assert class_source.constructor_arguments("lightning_dpgan.fake_outside", "Stops") == ["mine"]
    assert class_source.constructor_arguments("lightning_dpgan.fake_outside", "FromMade") is None
    for made_elsewhere in ("Fields", "Assigned"):  # a decorator's or an assignment's __init__: not in the source
        assert class_source.constructor_arguments("lightning_dpgan.fake_outside", made_elsewhere) is None
    assert class_source.first_doc_line("lightning_dpgan.fake_outside", "Missing") is None
    entry = registry.Entry("outside", "lightning_dpgan.fake_outside:Outside")
    assert entry.settings() == list(init_arguments(entry.load()))
    assert "prog" in entry.settings() and entry.settings()[0] == "mine"


def test_a_module_outside_the_package_is_not_read():
    assert class_source.module_file("argparse") is None
    assert class_source.module_file("lightning_dpgan.no_such_module") is None
    assert class_source.module_file("lightning_dpgan.datamodules.adult") == REPO / "datamodules" / "adult.py"


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"], ["sample", "--help"], ["evaluate", "--help"],
                                  ["audit", "--help"], ["audit", "--trials", "x"]])
def test_help_answers_without_importing_torch(argv):
    """Help used to import every registered class (torch, Lightning, Opacus) before it printed:
    about ten seconds. It must still list the classes with their descriptions."""
    code = ("import sys\nfrom lightning_dpgan.cli import main\n"
            f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
            "print('TORCH LOADED' if 'torch' in sys.modules else 'NO TORCH')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert result.stdout.rstrip().endswith("NO TORCH"), result.stdout[-300:]
    if argv[0] == "train":
        assert "Wasserstein GAN: critic with weight clipping" in result.stdout
        assert "--privacy.lap_inverse_scale" in result.stdout
