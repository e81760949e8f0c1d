"""The house rules of ARCHITECTURE.md: every module sits on a floor, no import runs up a floor,
there are no import circles, and no module reaches into another object's private state.

The floors are the wings of ``src/logstore`` (one subpackage each, plus the few modules the
project's layout keeps at the top). A new module lands on the floor of its package; a module
outside every package must be added to FLOORS (and to ARCHITECTURE.md).
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "src" / "logstore"

#: floor -> the modules and packages on it, bottom up (ARCHITECTURE.md's order). A name stands
#: for the module of that name and, for a package, every module inside it; the longest name that
#: matches a module decides its floor ("" is the package's own ``__init__``).
FLOORS: list[tuple[str, set[str]]] = [
    ("base", {"errors", "errorcodes", "_fileio", "metrics", "checkpoint", "_native"}),
    ("records", {"records"}),
    ("net", {"net"}),
    ("segment", {"index", "segment", "pinnedmap", "log.filenames", "log.pointread", "log.segmentscan"}),
    ("log", {"log", "cleaner"}),
    ("groups", {"groups"}),
    ("txn", {"txn"}),
    ("tiered", {"tiered"}),
    ("store", {"store"}),
    ("kafka", {"kafka"}),
    ("client", {"client"}),
    ("replication", {"replica", "replication"}),
    ("apps", {"spark", "tools", "mirror", "cli", "testing", "seaweedfs", "__main__", "netprotocol", ""}),
]
#: modules of these floors may import only from the floors listed (the network layer knows no logs)
ONLY: dict[str, set[str]] = {"net": {"base", "net"}}

#: Reads and writes of another object's single-underscore attributes (``name._x`` where ``name``
#: is not ``self``/``cls``, and ``self.part._x``) that are allowed, as "module: expression" with
#: the reason (also in ARCHITECTURE.md). Every other one fails: give that state an owner with
#: methods instead.
ALLOWED_PRIVATE_ACCESSES: dict[str, str] = {}
#: underscore names that are public by convention (namedtuple's API, the standard library's)
_CONVENTIONAL = {"_make", "_replace", "_asdict", "_fields", "_exit", "_getframe"}


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: dict[str, pathlib.Path] = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))
                                    if "_native" not in p.parts[len(PACKAGE.parts):-1] or p.name == "__init__.py"}
MODULES = {name: path for name, path in MODULES.items() if not name.startswith("_native.")}


def _floor_of(module: str) -> int:
    best, rank = -1, -1
    for i, (_, names) in enumerate(FLOORS):
        for name in names:
            if (module == name or name == "" and module == "" or module.startswith(name + ".")) and len(name) > best:
                best, rank = len(name), i
    if rank < 0:
        raise AssertionError(f"module logstore.{module} is on no floor: add it to FLOORS in {__file__} "
                             "and to ARCHITECTURE.md")
    return rank


def _owner(target: str) -> str:
    """The module ``target`` (a dotted name under logstore) names, or the module it is an attribute of."""
    while target and target not in MODULES and not target.startswith("_native"):
        target = target.rpartition(".")[0]
    return "_native" if target.startswith("_native") else target


def _targets(node: ast.Import | ast.ImportFrom, package: list[str]) -> list[str]:
    """The logstore modules one import statement names (none for other packages)."""
    if isinstance(node, ast.Import):
        return [_owner(alias.name.partition(".")[2]) for alias in node.names
                if alias.name.split(".")[0] == "logstore"]
    if node.level:
        base = package[:len(package) - (node.level - 1)]
        prefix = [*base, *(node.module.split(".") if node.module else [])]
    elif (node.module or "").split(".")[0] == "logstore":
        node_module = node.module.partition(".")[2]  # type: ignore[union-attr]
        prefix = node_module.split(".") if node_module else []
    else:
        return []
    return [_owner(".".join([*prefix, alias.name])) for alias in node.names]


def _import_sites(module: str) -> dict[str, bool]:
    """The logstore modules ``module`` imports (at module level, inside functions or for
    typing), each with whether every import of it sits inside a function."""
    path = MODULES[module]
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    if module == "":
        package = []
    out: dict[str, bool] = {}

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for target in _targets(child, package):
                    out[target] = out.get(target, True) and in_function
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(path.read_text(), str(path)), False)
    out.pop(module, None)
    return out


SITES = {module: _import_sites(module) for module in MODULES}
GRAPH = {module: set(sites) for module, sites in SITES.items()}

#: Imports that run up a floor on purpose, made inside a function (checked below) and skipped by
#: the floor and circle checks. ``LogStore.producer()`` and ``LogStore.consumer()`` hand out the
#: client wing's objects, one floor up: the factory imports its class when called, as pandas'
#: accessors import their implementation, so that the store's module never depends on the
#: client wing (and ``import logstore.store`` does not load it).
LATE_IMPORTS: set[tuple[str, str]] = {("store.store", "client.producer"), ("store.store", "client.consumer")}


def test_late_imports_are_made_inside_functions() -> None:
    for importer, imported in sorted(LATE_IMPORTS):
        assert imported in SITES[importer], f"logstore.{importer} no longer imports logstore.{imported}: " \
                                            "take the pair off LATE_IMPORTS"
        assert SITES[importer][imported], (f"logstore.{importer} imports logstore.{imported} at module level; "
                                           "a late import must sit inside the function that needs it")


@pytest.mark.parametrize("module", sorted(MODULES), ids=lambda m: m or "__init__")
def test_no_import_runs_up_a_floor(module: str) -> None:
    rank = _floor_of(module)
    floor = FLOORS[rank][0]
    for imported in sorted(GRAPH[module]):
        if (module, imported) in LATE_IMPORTS:
            continue
        other = _floor_of(imported)
        assert other <= rank, (f"logstore.{module} ({floor}) imports logstore.{imported} "
                               f"({FLOORS[other][0]}), a higher floor")
        if floor in ONLY:
            assert FLOORS[other][0] in ONLY[floor], (
                f"logstore.{module} ({floor}) may import only {sorted(ONLY[floor])}, not logstore.{imported}")


def _circles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in MODULES or (v, w) in LATE_IMPORTS:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in MODULES:
        if v not in index:
            visit(v)
    return found


def test_no_import_circles() -> None:
    assert _circles() == []


def test_the_check_sees_a_circle_and_an_upward_import() -> None:
    # The checks above must be able to fail: a made-up circle is found, an upward import ranked.
    saved = dict(GRAPH)
    try:
        GRAPH["errors"] = {"metrics"}
        GRAPH["metrics"] = {"errors"}
        assert ["errors", "metrics"] in _circles()
    finally:
        GRAPH.clear()
        GRAPH.update(saved)
    assert _floor_of("log.log") > _floor_of("records.batch") > _floor_of("errors")
    assert _floor_of("kafka.server") > _floor_of("store.store")


@pytest.mark.parametrize("module", sorted(MODULES), ids=lambda m: m or "__init__")
def test_module_docstring_says_what_it_holds(module: str) -> None:
    doc = ast.get_docstring(ast.parse(MODULES[module].read_text()))
    assert doc and doc.strip().splitlines()[0].strip(), f"logstore.{module} has no module docstring"


def private_accesses(source: str) -> list[str]:
    """Each ``x._name`` in ``source`` whose ``x`` is not ``self`` or ``cls`` (``self.part._name``
    counts: the part is another object)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                and node.attr not in _CONVENTIONAL
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_private_access_finder() -> None:
    assert private_accesses("self._a; cls._b; x.__len__; t._replace()") == []
    assert private_accesses("log._segments\nself.node._stop") == ["1: log._segments", "2: self.node._stop"]


@pytest.mark.parametrize("module", sorted(MODULES), ids=lambda m: m or "__init__")
def test_no_reach_into_another_objects_private_state(module: str) -> None:
    found = [f for f in private_accesses(MODULES[module].read_text())
             if f"{module}: {f.partition(': ')[2]}" not in ALLOWED_PRIVATE_ACCESSES]
    assert not found, (
        f"logstore.{module} reads or writes another object's private attributes: give that state an "
        "owner with methods instead\n" + "\n".join(found))


def private_imports(source: str) -> list[str]:
    """The single-underscore names ``source`` imports from logstore's modules (relative or
    absolute); the package's private modules themselves (``_native``, ``_fileio``) may be imported."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == "logstore"):
            found += [f"{node.lineno}: {alias.name}" for alias in node.names
                      if alias.name.startswith("_") and not alias.name.startswith("__")
                      and alias.name not in ("_native", "_fileio")]
    return found


def test_private_import_finder() -> None:
    assert private_imports("from . import _fileio\nfrom .x import _y, z\nfrom os import _exit") == ["2: _y"]


@pytest.mark.parametrize("module", sorted(MODULES), ids=lambda m: m or "__init__")
def test_no_private_name_imported_from_another_module(module: str) -> None:
    assert private_imports(MODULES[module].read_text()) == [], (
        f"logstore.{module} imports another module's private names: make them public there")
