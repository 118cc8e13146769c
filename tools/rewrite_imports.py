"""Rewrite imports of spark_statebackend's earlier layouts (flat, or issue 13's) to the current one.

    python tools/rewrite_imports.py FILE...          rewrite in place, print what changed
    python tools/rewrite_imports.py --check FILE...  print what would change; exit 1 if anything would
    python tools/rewrite_imports.py --markdown       print the module map (docs/module-map.md's tables)

For code written against the layout before issue 13 or before issue 24 (e.g. a branch developed in
parallel). MODULES maps every old module to its new home; NAMES the names that moved elsewhere than
their module's home (a module split by responsibility). Rewritten, anywhere in a file (inside strings
too, such as `python -c` snippets):
- `from spark_statebackend.<old> import a, b as c` (also parenthesised over several lines): one statement
  per new module the names now live in;
- `from spark_statebackend import <old> [as x]` and `import spark_statebackend.<old> [as x]`: the module
  the file's uses `x.<name>` point to (the first one's, with a warning, if they point to several);
- dotted module names in text (`-m spark_statebackend.sidecar`, `"spark_statebackend.blobstore."`) and
  paths (`spark_statebackend/spool.py`), except logger names (`getLogger(...)`, `logger=...`): every
  logger kept its name. A path or dotted name of a split module becomes its main part's.
Run `ruff check --fix` afterwards to sort the imports. Relative imports inside the package are not
rewritten (the package itself is already in the new layout).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

PKG = "spark_statebackend"
_ROOT = Path(__file__).resolve().parent.parent  # the checkout whose layout is the new one

#: old module (relative to the package) -> new module. Modules not listed kept their place
#: (errors, demo, demo_app, the package itself).
MODULES: dict[str, str] = {
    "units": "common.units",
    "durable": "common.durable",
    "nofollow": "common.nofollow",
    "crashpoints": "common.crashpoints",
    "metrics": "common.metrics",
    "extras": "common.extras",
    "blobstore": "stores",
    "blobstore.base": "stores.base",
    "blobstore.local": "stores.local",
    "blobstore.azure": "stores.azure",
    "blobstore.s3": "stores.s3",
    "blobstore._cloud": "stores.cloud",
    "retry": "stores.retry",
    "checksum": "engine.checksum",
    "index": "engine.index",
    "diff": "engine.diff",
    "transfer": "engine.transfer",
    "backup": "engine.backup",
    "restore": "engine.restore",
    "checkpoint": "checkpoints.checkpoint",
    "checkpointlog": "checkpoints.logs",
    "checkpointlog._options": "checkpoints.logs._options",
    "checkpointlog.file": "checkpoints.logs.file",
    "checkpointlog.kafka": "checkpoints.logs.kafka",
    "markers": "lifecycle.reports",
    "retention": "lifecycle.retention",
    "gc": "lifecycle.gc",
    "snapshots": "lifecycle.snapshots",
    "spool": "runtime.spool",
    "sidecar": "runtime.sidecar",
    "commit": "runtime.committer",
    "config": "settings",
    "validate": "spark.validate",
    "query_status": "spark.query_status",
    "compat": "spark.compat",
    "spark": "spark.enable",
    "cli": "cli",
    # Issue 24: the checkpoint model and log stayed in checkpoints/, the blobs built on the engine went
    # to lifecycle/, the settings of the whole system out of spark/.
    "checkpoints.gc": "lifecycle.gc",
    "checkpoints.locators": "lifecycle.locators",
    "checkpoints.markers": "lifecycle.markers",
    "checkpoints.plans": "lifecycle.plans",
    "checkpoints.reachability": "lifecycle.reachability",
    "checkpoints.reports": "lifecycle.reports",
    "checkpoints.retention": "lifecycle.retention",
    "checkpoints.snapshots": "lifecycle.snapshots",
    "spark.config": "settings",
    "engine.store_instance": "checkpoints.store_instance",
    "engine.index": "engine.index",  # kept its place; check_name left it (NAMES)
    # Issue 24, item 6: large runtime/ and spark/ modules split; they kept their place (NAMES).
    "runtime.restore_loop": "runtime.restore_loop",
    "runtime.upload_loop": "runtime.upload_loop",
    "spark.driver_restore": "spark.driver_restore",
    "engine.backup": "engine.backup",
}

#: (old module, name) -> new module, for the names that left their module's new home.
NAMES: dict[tuple[str, str], str] = {
    ("config", "file_url_path"): "common.urls",
    ("commit", "BLOBSTORE_BACKEND"): "checkpoints.checkpoint",
    ("commit", "DRIVER_STORE"): "checkpoints.checkpoint",
    ("index", "check_blob_id"): "stores.base",
    ("index", "MAX_BLOB_ID_CHARS"): "stores.base",
    ("backup", "SnapshotOwner"): "engine.blobs",
    ("backup", "blob_segment"): "engine.blobs",
    ("backup", "files_prefix"): "engine.blobs",
    ("backup", "indexes_prefix"): "engine.blobs",
    ("backup", "load_snapshot_index"): "engine.blobs",
    ("backup", "parse_store_key"): "engine.blobs",
    ("index", "encode_snapshot_index"): "engine.index_codec",
    ("index", "decode_snapshot_index"): "engine.index_codec",
    ("restore", "VerifyReport"): "engine.verify",
    ("restore", "verify_snapshot"): "engine.verify",
    ("restore", "RESTORED_MODE_MASK"): "engine.placing",
    ("spark", "restore_checkpoint_location"): "spark.driver_restore",
    ("spark", "snapshot_problems"): "spark.driver_restore",
    ("spark", "read_query_id"): "spark.location",
    ("commit", "stage_driver_files"): "spark.location",
    ("commit", "state_instances"): "spark.location",
    ("commit", "ProgressEvent"): "runtime.progress",
    ("commit", "UnusableMarkerError"): "lifecycle.markers",
    ("commit", "load_marker_index"): "lifecycle.markers",
    ("commit", "REFRESH_WINDOW_SECONDS"): "runtime.upgrades",
    ("commit", "REFRESH_FIRST_POLL_SECONDS"): "runtime.upgrades",
    ("commit", "REFRESH_MAX_POLL_SECONDS"): "runtime.upgrades",
    ("commit", "DEFAULT_SWEEP_INTERVAL_SECONDS"): "runtime.sweeper",
    ("commit", "FIRST_SWEEP_DELAY_SECONDS"): "runtime.sweeper",
    ("commit", "SWEEP_WORKERS"): "runtime.sweeper",
    ("sidecar", "STATUS_FILE"): "runtime.upload_lag",
    ("sidecar", "RETRY_INITIAL_SECONDS"): "runtime.upload_lag",
    ("sidecar", "RETRY_MAX_SECONDS"): "runtime.upload_lag",
    ("sidecar", "_recency"): "runtime.upload_loop",
    ("sidecar", "RESTORE_WORKERS"): "runtime.restore_loop",
    ("sidecar", "RESTORE_QUEUE"): "runtime.restore_loop",
    ("sidecar", "RESTORE_PLACE_MARGIN_SECONDS"): "runtime.restore_loop",
    ("sidecar", "PROGRESS_DIR"): "runtime.commit_loop",
    ("gc", "CLI_QUERY"): "engine.blobs",
    ("gc", "QUERY_PREFIXES"): "lifecycle.reachability",
    ("gc", "query_of"): "lifecycle.reachability",
    ("gc", "newest_indexes"): "lifecycle.reachability",
    ("retention", "snapshot_closure"): "lifecycle.reachability",
    ("markers", "LocatorEntry"): "lifecycle.locators",
    ("markers", "locator_id"): "lifecycle.locators",
    ("markers", "write_locator"): "lifecycle.locators",
    ("markers", "locator_entries"): "lifecycle.locators",
    ("markers", "read_locator"): "lifecycle.locators",
    ("index", "check_name"): "common.names",
    ("index", "MAX_NAME_BYTES"): "common.names",
    ("engine.index", "check_name"): "common.names",
    ("engine.index", "MAX_NAME_BYTES"): "common.names",
    ("runtime.restore_loop", "placing_order"): "runtime.store_restore",
    ("runtime.upload_loop", "BATCH_HOLD_SECONDS"): "runtime.batch_hold",
    ("runtime.upload_loop", "BatchHold"): "runtime.batch_hold",
    ("spark.driver_restore", "place_plans"): "spark.rebuild",
    ("engine.backup", "MAX_CLEANUP_CHAIN"): "engine.cleanup_chain",
}

#: (old module, name) still importable from the new package that has the old module's name (the
#: package re-exports it: README's `import spark_statebackend.spark as s; s.jar_path()`).
REEXPORTED: frozenset[tuple[str, str]] = frozenset({("spark", "jar_path")})

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_NAME = rf"{_IDENT}(?:[ \t]+as[ \t]+{_IDENT})?"
_FROM = re.compile(
    rf"(?P<indent>^[ \t]*)?from[ \t]+{PKG}(?P<mod>(?:\.{_IDENT})*)[ \t]+import[ \t]+"
    rf"(?P<names>\([^)]*\)|{_NAME}(?:[ \t]*,[ \t]*{_NAME})*)",
    re.MULTILINE,
)
_IMPORT = re.compile(
    rf"(?P<indent>^[ \t]*)?import[ \t]+{PKG}(?P<mod>(?:\.{_IDENT})+)(?:[ \t]+as[ \t]+(?P<alias>{_IDENT}))?",
    re.MULTILINE,
)
_DOTTED = re.compile(rf"(?<![\w.]){PKG}(?P<mod>(?:\.{_IDENT})+)")
_PATH = re.compile(rf"(?<![\w/]){PKG}/(?P<path>(?:{_IDENT}/)*{_IDENT})(?P<suffix>\.py|/)")
_LOGGER_CONTEXT = re.compile(r"(getLogger\(|logger[ \t]*=[ \t]*)[\"']$")


def _exists(module: str) -> bool:
    """Whether `module` (relative to the package) is a module or package of the current layout."""
    base = _ROOT / PKG / module.replace(".", "/")
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def new_module(old: str, name: str | None = None) -> str | None:
    """Where `name` of old module `old` lives now (the module itself when `name` is None); None when
    `old` is no old module."""
    if name is not None and (old, name) in NAMES:
        return NAMES[(old, name)]
    return MODULES.get(old)


def _split_names(text: str) -> list[tuple[str, str | None]]:
    text = re.sub(r"#[^\n]*", "", text.strip().strip("()"))
    out = []
    for item in (t.strip() for t in text.replace("\n", " ").split(",")):
        if item:
            name, _, alias = (p.strip() for p in item.partition(" as "))
            out.append((name, alias or None))
    return out


def _format_from(module: str, names: list[tuple[str, str | None]]) -> str:
    parts = [n if not a or a == n else f"{n} as {a}" for n, a in names]
    return f"from {PKG}{'.' + module if module else ''} import {', '.join(parts)}"


class Rewriter:
    def __init__(self, text: str, source: str) -> None:
        self.text = text
        self.source = source
        self.warnings: list[str] = []

    def _attrs(self, alias: str) -> set[str]:
        return set(re.findall(rf"(?<![\w.]){re.escape(alias)}\.({_IDENT})", self.text))

    def _module_for_alias(self, old: str, alias: str) -> str:
        """The new module a module alias must name: the one the file's `alias.<name>` uses point to."""
        attrs = self._attrs(alias)
        if attrs and all((old, a) in REEXPORTED for a in attrs):
            return old
        targets: dict[str, list[str]] = {}
        for attr in sorted(attrs):
            targets.setdefault(new_module(old, attr) or MODULES[old], []).append(attr)
        if len(targets) > 1:
            listed = "; ".join(f"{m}: {', '.join(a)}" for m, a in sorted(targets.items()))
            self.warnings.append(
                f"{self.source}: `{alias}` ({PKG}.{old}) is used for names now in several modules "
                f"({listed}); it now names {PKG}.{MODULES[old]}: import the others yourself"
            )
        return MODULES[old] if len(targets) != 1 else next(iter(targets))

    def _joiner(self, m: re.Match[str]) -> str:
        indent = m.group("indent")
        return "\n" + indent if indent is not None else "; "

    def _from(self, m: re.Match[str]) -> str:
        mod = m.group("mod").lstrip(".")
        names = _split_names(m.group("names"))
        if not mod:  # from spark_statebackend import <module> [as x], or a name of the package itself
            stmts = []
            for name, alias in names:
                if name not in MODULES:
                    stmts.append(_format_from("", [(name, alias)]))
                    continue
                target = self._module_for_alias(name, alias or name)
                parent, _, leaf = target.rpartition(".")
                stmts.append(_format_from(parent, [(leaf, alias or (name if leaf != name else None))]))
            out = self._joiner(m).join(stmts)
        elif mod in MODULES:
            groups: dict[str, list[tuple[str, str | None]]] = {}
            for name, alias in names:
                sub = f"{mod}.{name}"
                if _exists(sub) and sub not in MODULES:  # a module of the new package of that name
                    groups.setdefault(mod, []).append((name, alias))
                    continue
                if sub in MODULES:  # from spark_statebackend.<pkg> import <module>
                    parent, _, leaf = MODULES[sub].rpartition(".")
                    groups.setdefault(parent, []).append((leaf, alias or (name if leaf != name else None)))
                    continue
                target = mod if (mod, name) in REEXPORTED else new_module(mod, name)
                assert target is not None
                groups.setdefault(target, []).append((name, alias))
            out = self._joiner(m).join(_format_from(t, n) for t, n in groups.items())
        else:
            return m.group(0)
        return (m.group("indent") or "") + out

    def _import(self, m: re.Match[str]) -> str:
        mod = m.group("mod").lstrip(".")
        if mod not in MODULES:
            return m.group(0)
        alias = m.group("alias")
        if alias is None:
            target = MODULES[mod]
            self.warnings.append(f"{self.source}: `import {PKG}.{mod}` imports {PKG}.{target} now")
            return f"{m.group('indent') or ''}import {PKG}.{target}"
        return f"{m.group('indent') or ''}import {PKG}.{self._module_for_alias(mod, alias)} as {alias}"

    def _dotted(self, m: re.Match[str]) -> str:
        parts = m.group("mod").lstrip(".").split(".")
        before = self.text[max(0, m.start() - 40) : m.start()]
        if _LOGGER_CONTEXT.search(before):
            return m.group(0)  # a logger name: every logger kept its name
        for n in range(len(parts), 0, -1):  # the longest prefix that is a module, old or new
            prefix, rest = ".".join(parts[:n]), parts[n:]
            if prefix in MODULES and MODULES[prefix] != prefix:
                if _exists(".".join([prefix, *rest[:1]])) or (rest and (prefix, rest[0]) in REEXPORTED):
                    return m.group(0)  # a package of the new layout that has an old module's name
                target = (new_module(prefix, rest[0]) if rest else None) or MODULES[prefix]
                return f"{PKG}.{'.'.join([*target.split('.'), *rest])}"
            if _exists(prefix):
                return m.group(0)  # names a module of the current layout (or something in one)
        return m.group(0)

    def _path(self, m: re.Match[str]) -> str:
        old = m.group("path").replace("/", ".")
        if old not in MODULES or MODULES[old] == old:
            return m.group(0)
        new = MODULES[old].replace(".", "/")
        if m.group("suffix") == ".py" and not _exists(MODULES[old]):
            return m.group(0)
        if m.group("suffix") == ".py" and not (_ROOT / PKG / f"{new}.py").is_file():
            return f"{PKG}/{new}/"  # a module that became a package
        return f"{PKG}/{new}{m.group('suffix')}"

    def run(self) -> str:
        # Import statements first; then dotted names and paths outside them (the statements written
        # above already name new modules, which the dotted pass leaves alone).
        text = _FROM.sub(self._from, self.text)
        self.text = text
        text = _IMPORT.sub(self._import, text)
        self.text = text
        text = _DOTTED.sub(self._dotted, text)
        self.text = text
        return _PATH.sub(self._path, text)


def module_map_markdown() -> str:
    rows = ["| old module | new module |", "|---|---|"]
    for old, new in MODULES.items():
        moved = sorted(n for (o, n) in NAMES if o == old)
        rows.append(f"| `{PKG}.{old}` | `{PKG}.{new}` |")
        for name in moved:
            rows.append(f"| `{PKG}.{old}.{name}` | `{PKG}.{NAMES[(old, name)]}.{name}` |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file would change")
    ap.add_argument("--markdown", action="store_true", help="print the module map as Markdown")
    args = ap.parse_args(argv)
    if args.markdown:
        sys.stdout.write(module_map_markdown())
        return 0
    changed = 0
    for path in args.files:
        text = path.read_text()
        rw = Rewriter(text, str(path))
        new = rw.run()
        for w in rw.warnings:
            print(f"warning: {w}", file=sys.stderr)
        if new != text:
            changed += 1
            print(f"{'would rewrite' if args.check else 'rewrote'} {path}")
            if not args.check:
                path.write_text(new)
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
