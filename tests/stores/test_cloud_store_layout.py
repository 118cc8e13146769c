"""The layout stated in stores/cloud/__init__.py: the cloud store's parts import one another without a
circle, none imports store.py (the facade), and none reaches into another object's private members."""

from __future__ import annotations

import ast
from pathlib import Path

import spark_statebackend.stores.cloud as cloud
from tests.importgraph import cycles

PACKAGE = Path(cloud.__file__).parent


def _trees(package: Path) -> dict[str, ast.Module]:
    return {p.stem: ast.parse(p.read_text(), str(p)) for p in sorted(package.glob("*.py"))}


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (relative imports, TYPE_CHECKING ones included)."""
    trees = _trees(package)
    graph: dict[str, set[str]] = {}
    for name, tree in trees.items():
        deps: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module:
                    deps.add(node.module.split(".")[0])
                else:
                    deps |= {a.name for a in node.names}
        graph[name] = deps & set(trees)
    return graph


def private_reaches(package: Path) -> list[str]:
    """`x._member` where x is not self or cls: one part using another's internals."""
    out: list[str] = []
    for name, tree in _trees(package).items():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
            ):
                out.append(f"{name}.py:{node.lineno}: {ast.unparse(node)}")
    return out


def test_the_cloud_store_modules_import_each_other_without_a_circle() -> None:
    graph = import_graph(PACKAGE)
    assert cycles(graph) == []
    # Only the package's __init__ re-exports the facade; the parts never call back into it.
    assert [m for m, deps in graph.items() if "store" in deps] == ["__init__"]


def test_no_part_of_the_cloud_store_reaches_into_another_objects_privates() -> None:
    assert private_reaches(PACKAGE) == []
