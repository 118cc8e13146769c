"""Measure the package's modules and functions against the size limits of issue 24 (item 6).

    python tools/sizes.py            # the longest modules and functions, then what is over a limit
    python tools/sizes.py --top 30

A module over MODULE_LIMIT lines or a function (or method) over FUNCTION_LIMIT lines is reported, and
the exit status is 1; tests/package/test_sizes.py runs the same check. Lines are counted as they stand
in the file (docstrings, comments and blank lines included): what a reader scrolls through. A module
that is long because it holds one table, and nothing else, may be listed in LONG_TABLES with the reason;
docs/module-map.md says which.
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "spark_statebackend"

#: About 400 lines a module; the slack keeps a small fix from forcing a split.
MODULE_LIMIT = 410
FUNCTION_LIMIT = 80

#: Modules allowed over MODULE_LIMIT (path below the package -> why): each is one table.
LONG_TABLES: dict[str, str] = {
    "settings.py": "the KEYS table (every spark.statebackend.* key, declared once) and Settings read "
    "through it",
}


@dataclass(frozen=True)
class Measured:
    """One module or function: where it is (`path` below the package, and `name` for a function) and
    how many lines it spans."""

    path: str
    name: str
    lines: int

    def __str__(self) -> str:
        return f"{self.lines:5d}  {self.path}" + (f"  {self.name}" if self.name else "")


def _functions(tree: ast.AST, path: str, prefix: str = "") -> list[Measured]:
    """Every function and method of `tree`, nested ones too, named `Class.method` / `outer.inner`."""
    found: list[Measured] = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None  # set by ast.parse
            name = prefix + node.name
            found.append(Measured(path, f"{name} (line {node.lineno})", node.end_lineno - node.lineno + 1))
            found += _functions(node, path, name + ".")
        elif isinstance(node, ast.ClassDef):
            found += _functions(node, path, prefix + node.name + ".")
        else:
            found += _functions(node, path, prefix)
    return found


def measure(package: Path = PACKAGE) -> tuple[list[Measured], list[Measured]]:
    """(modules, functions) of every .py file below `package`, each list longest first."""
    modules: list[Measured] = []
    functions: list[Measured] = []
    for file in sorted(package.rglob("*.py")):
        path = file.relative_to(package).as_posix()
        source = file.read_text(encoding="utf-8")
        modules.append(Measured(path, "", len(source.splitlines())))
        functions += _functions(ast.parse(source, str(file)), path)
    key = lambda m: (-m.lines, m.path, m.name)  # noqa: E731
    return sorted(modules, key=key), sorted(functions, key=key)


def over_limits(package: Path = PACKAGE) -> list[str]:
    """What is over a limit below `package`, one line each (empty: nothing)."""
    modules, functions = measure(package)
    over = [
        f"module {m.path}: {m.lines} lines (limit {MODULE_LIMIT})"
        for m in modules
        if m.lines > MODULE_LIMIT and m.path not in LONG_TABLES
    ]
    over += [
        f"function {f.path} {f.name}: {f.lines} lines (limit {FUNCTION_LIMIT})"
        for f in functions
        if f.lines > FUNCTION_LIMIT
    ]
    return over


def main(argv: list[str] | None = None) -> int:
    """Print the longest modules and functions and what is over a limit; 1 if anything is."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--top", type=int, default=15, help="how many of the longest to list (default 15)")
    args = ap.parse_args(argv)
    modules, functions = measure()
    print(f"longest modules (limit {MODULE_LIMIT}; one-table modules exempt: {', '.join(LONG_TABLES)}):")
    print("\n".join(str(m) for m in modules[: args.top]))
    print(f"longest functions (limit {FUNCTION_LIMIT}):")
    print("\n".join(str(f) for f in functions[: args.top]))
    over = over_limits()
    print("\n".join(["over a limit:", *over]) if over else "nothing over a limit")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
