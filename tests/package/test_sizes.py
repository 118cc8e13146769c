"""The size limits of issue 24 (item 6), kept by tools/sizes.py: no module of the package much over 400
lines (but a one-table module listed in LONG_TABLES) and no function over 80."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _sizes() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ssb_sizes_test", ROOT / "tools" / "sizes.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def test_no_module_or_function_of_the_package_is_over_its_limit() -> None:
    sizes = _sizes()
    assert sizes.over_limits() == [], (
        "split along a seam (docs/module-map.md); `python tools/sizes.py` lists them"
    )


def test_the_measure_finds_a_long_module_and_a_long_method(tmp_path: Path) -> None:
    sizes = _sizes()
    body = "\n".join(f"        x{i} = {i}" for i in range(sizes.FUNCTION_LIMIT))
    source = f"class A:\n    def long(self) -> None:\n{body}\n\n\ndef short() -> None:\n    pass\n"
    padding = "\n" * (sizes.MODULE_LIMIT - len(source.splitlines()) + 1)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "big.py").write_text(source + padding)
    over = sizes.over_limits(tmp_path)
    module, function = sizes.MODULE_LIMIT, sizes.FUNCTION_LIMIT
    assert over == [
        f"module sub/big.py: {module + 1} lines (limit {module})",
        f"function sub/big.py A.long (line 2): {function + 1} lines (limit {function})",
    ]
