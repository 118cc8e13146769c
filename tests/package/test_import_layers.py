"""The package's layout (docs/module-map.md, "Import order"): no import circle between any two of its
modules, and every import goes down the layer order below, never up.

The graph is built from the source (ast), not by importing: every `import`/`from ... import` of a
package module, relative or absolute, at module level or inside a function (a function-level import
still closes a circle at run time, only later). Left out: imports under `if TYPE_CHECKING:` (never run)
and the implicit import of a module's parent packages (`from ..lifecycle.gc import x` is an edge to
lifecycle.gc only)."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import spark_statebackend
from tests.importgraph import cycles

PACKAGE = Path(spark_statebackend.__file__).parent
ROOT = "spark_statebackend"

#: The layers, lowest first: a module may import its own layer's modules and lower layers' only. A
#: layer is a subpackage or a top-level module; ROOT is the package's own __init__
#: (`__version__`, and `configure`/`status`, which call into spark/).
LAYERS: tuple[str, ...] = (
    "errors",
    "common",
    "stores",
    "checkpoints",
    "engine",
    "lifecycle",
    "settings",
    "spark",
    ROOT,
    "runtime",
    "cli",
    "demo",
    "demo_app",
)


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(nodes: Iterable[ast.AST]) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement in `nodes` and below, except those under `if TYPE_CHECKING:`."""
    found: list[ast.Import | ast.ImportFrom] = []
    for node in nodes:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            found += _imports(node.orelse)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        else:
            found += _imports(ast.iter_child_nodes(node))
    return found


def _targets(node: ast.Import | ast.ImportFrom, name: str, is_package: bool, modules: set[str]) -> set[str]:
    """The package modules `node` (in module `name`) imports."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name in modules}
    if node.level:
        base = name.split(".") if is_package else name.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        source = ".".join([*base, node.module] if node.module else base)
    else:
        source = node.module or ""
    if source not in modules:
        return set()
    # `from pkg import sub` imports the module pkg.sub when there is one, else a name of pkg.
    return {f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source for a in node.names}


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports (self-imports of a package's names dropped)."""
    paths = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    modules = set(paths)
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        tree = ast.parse(path.read_text(), str(path))
        is_package = path.name == "__init__.py"
        deps: set[str] = set()
        for node in _imports(tree.body):
            deps |= _targets(node, name, is_package, modules)
        graph[name] = deps - {name}
    return graph


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ROOT


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Each import from a lower layer to a higher one, as `module -> module`."""
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    return sorted(
        f"{module} -> {dep}"
        for module, deps in graph.items()
        for dep in deps
        if rank[layer_of(dep)] > rank[layer_of(module)]
    )


def test_every_module_is_in_a_layer() -> None:
    unknown = {layer_of(m) for m in import_graph()} - set(LAYERS)
    assert not unknown, f"add {sorted(unknown)} to LAYERS here and to docs/module-map.md"


def test_graph_sees_the_imports() -> None:
    # The walk must find relative, absolute, package-level and function-level imports; else the
    # assertions below would pass on an empty graph.
    graph = import_graph()
    assert "spark_statebackend.lifecycle.reachability" in graph["spark_statebackend.lifecycle.gc"]
    assert "spark_statebackend.checkpoints.logs" in graph["spark_statebackend.lifecycle.gc"]
    assert "spark_statebackend.lifecycle.gc" in graph["spark_statebackend.settings"]
    assert "spark_statebackend.lifecycle.snapshots" in graph["spark_statebackend.cli.history"]
    assert "spark_statebackend.checkpoints.logs" in graph["spark_statebackend.demo_app"]


def test_no_import_circles() -> None:
    assert cycles(import_graph()) == []


def test_imports_go_down_the_layers() -> None:
    assert upward_imports(import_graph()) == []


def test_the_checks_catch_a_circle_and_an_upward_import() -> None:
    graph = {
        "spark_statebackend.engine.a": {"spark_statebackend.lifecycle.b"},
        "spark_statebackend.lifecycle.b": {"spark_statebackend.engine.a"},
    }
    assert cycles(graph)
    assert upward_imports(graph) == ["spark_statebackend.engine.a -> spark_statebackend.lifecycle.b"]
