"""A registered class's docstring and constructor arguments, read from its source file.

``--help`` lists every model, dataset and privacy strategy with its docstring's first line, and
each strategy with the settings its constructor takes. Importing the classes to read those
imports torch, Lightning and Opacus: about ten seconds on a small machine before any help
appears. Their source files say the same without being imported, so these functions parse them
with :mod:`ast` instead.

Bases are followed in Python's method resolution order across this package's modules. What
the source cannot settle without running code gives ``None`` -- a base made at run time or
renamed on import, a metaclass, a decorated class (``@dataclass`` writes its ``__init__``), a
``**kwargs`` chain that reaches a class from another package, a file that is not Python
source -- and the caller imports the class (:class:`lightning_dpgan.registry.Entry`): slower,
never different. ``tests/test_class_source.py`` checks both give the same for every registered
class.
"""
from __future__ import annotations

import ast
import functools
import importlib.machinery
import importlib.util
from pathlib import Path

#: Packages whose classes are read from source; a base class elsewhere (Lightning's) is not.
OWN_PACKAGE = "lightning_dpgan"


def module_file(module_name: str) -> Path | None:
    """The source file of ``module_name``, found without importing it or the packages between
    it and :data:`OWN_PACKAGE` (``lightning_dpgan.modules`` imports Opacus on import)."""
    parts = module_name.split(".")
    if parts[0] != OWN_PACKAGE:
        return None
    # the first level through every finder (the install maps lightning_dpgan.callbacks and
    # .datamodules to folders of their own), which imports only lightning_dpgan itself
    spec = importlib.util.find_spec(".".join(parts[:2]))
    for depth in range(2, len(parts)):
        locations = spec.submodule_search_locations if spec is not None else None
        if not locations:
            return None
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: depth + 1]), list(locations))
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    return Path(spec.origin)


@functools.cache
def _parsed(module_name: str) -> ast.Module | None:
    path = module_file(module_name)
    if path is None:
        return None
    try:
        return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None


def _class_def(module_name: str, class_name: str) -> ast.ClassDef | None:
    tree = _parsed(module_name)
    if tree is None:
        return None
    return next((node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == class_name), None)


def first_doc_line(module_name: str, class_name: str) -> str | None:
    """The first line of the class's docstring ('' when it has none), or None when its source
    cannot be read. A class's ``__doc__`` is its own, never a base's, and so is this."""
    node = _class_def(module_name, class_name)
    if node is None:
        return None
    doc = ast.get_docstring(node, clean=True) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def _imported_from(module_name: str, name: str) -> str | None:
    """The module a top-level ``from X import name`` of ``module_name`` names, else None."""
    tree = _parsed(module_name)
    for node in tree.body if tree is not None else ():
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if any((alias.asname or alias.name) == name and alias.name == name for alias in node.names):
                return node.module
    return None


#: A class as :func:`_linearization` names it: ``(module, class)``; ``("", "object")`` is object.
ClassName = tuple[str, str]
OBJECT: ClassName = ("", "object")


def _bases_of(module_name: str, node: ast.ClassDef) -> list[ClassName] | None:
    """Where each base class of ``node`` is defined, in order; None when the source cannot say
    (a metaclass or other keyword, a base that is neither a name nor ``module.Name``). A base
    from outside this package is named by where it comes from; it is not read further."""
    if node.keywords:
        return None
    bases: list[ClassName] = []
    for base in node.bases:
        if isinstance(base, ast.Name) and _class_def(module_name, base.id) is not None:
            bases.append((module_name, base.id))
        elif isinstance(base, ast.Name) and (source := _imported_from(module_name, base.id)) is not None:
            bases.append((source, base.id))
        elif isinstance(base, ast.Attribute) and isinstance(base.value, (ast.Name, ast.Attribute)):
            bases.append((ast.unparse(base.value), base.attr))  # ``L.Callback``: never this package's
        else:
            return None
    return bases


def _own(where: ClassName) -> bool:
    return where[0] == OWN_PACKAGE or where[0].startswith(f"{OWN_PACKAGE}.")


def _linearization(where: ClassName) -> list[ClassName] | None:
    """The class's method resolution order (C3, as Python computes it) as far as this package's
    source tells: a class from outside it stands for itself followed by ``object``, which is
    right while none of this package's classes is among its bases. None when unreadable."""
    if where == OBJECT:
        return [OBJECT]
    if not _own(where):
        return [where, OBJECT]
    node = _class_def(*where)
    if node is None or _constructor_made_elsewhere(node):
        return None
    bases = _bases_of(where[0], node)
    if bases is None:
        return None
    lines = [_linearization(base) for base in bases] or [[OBJECT]]
    if any(line is None for line in lines):
        return None
    return _c3_merge([where], *[list(line) for line in lines], list(bases))


def _constructor_made_elsewhere(node: ast.ClassDef) -> bool:
    """Whether the class's ``__init__`` may come from somewhere its source does not spell out: a
    decorator (``@dataclass`` writes one) or an assignment to ``__init__`` in its body."""
    assigned = any(isinstance(item, (ast.Assign, ast.AnnAssign))
                   and any(isinstance(target, ast.Name) and target.id == "__init__"
                           for target in (item.targets if isinstance(item, ast.Assign) else [item.target]))
                   for item in node.body)
    return bool(node.decorator_list) or assigned


def _c3_merge(head: list[ClassName], *sequences: list[ClassName]) -> list[ClassName] | None:
    order, pending = list(head), [seq for seq in sequences if seq]
    while pending:
        candidate = next((seq[0] for seq in pending if not any(seq[0] in other[1:] for other in pending)), None)
        if candidate is None:  # no consistent order: Python would refuse the class too
            return None
        order.append(candidate)
        pending = [[item for item in seq if item != candidate] for seq in pending]
        pending = [seq for seq in pending if seq]
    return order


def _init_of(node: ast.ClassDef) -> ast.FunctionDef | None:
    return next((item for item in node.body if isinstance(item, ast.FunctionDef) and item.name == "__init__"), None)


def constructor_arguments(module_name: str, class_name: str) -> list[str] | None:
    """The keyword arguments the class takes, following ``**kwargs`` to its base classes, as
    :func:`lightning_dpgan.argument_types.init_arguments` gives them from the imported class;
    None when a link of that chain cannot be read from this package's source."""
    order = _linearization((module_name, class_name))
    if order is None:
        return None
    names: list[str] = []
    for where in order:
        if where == OBJECT:  # object's constructor takes nothing
            return names
        node = _class_def(*where) if _own(where) else None
        if node is None:  # a class from outside this package: its arguments are not read here
            return None
        init = _init_of(node)
        if init is None:
            continue
        arguments = init.args
        for argument in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
            if argument.arg != "self" and argument.arg not in names:
                names.append(argument.arg)
        if arguments.kwarg is None:
            return names
    return names
