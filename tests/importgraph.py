"""Import graphs of the package's modules, for the layout tests (test_cloud_store_layout.py,
test_import_layers.py): the circles in one."""

from __future__ import annotations


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle found by a depth-first walk, each as the path that closes it."""
    found: list[list[str]] = []
    finished: set[str] = set()

    def walk(path: list[str]) -> None:
        for dep in sorted(graph[path[-1]]):
            if dep in path:
                found.append([*path[path.index(dep) :], dep])
            elif dep not in finished:
                walk([*path, dep])
        finished.add(path[-1])

    for start in sorted(graph):
        if start not in finished:
            walk([start])
    return found
