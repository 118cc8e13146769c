"""Snapshots as the command line sees them: listing, short ids, `latest`, and forget policies.

A snapshot is a SnapshotIndex blob, `indexes/<query>/<store>/<label>-<rand>.json` (engine/blobs.py). Its
full id is that blob id; its *short id* is the first 8 hex digits of the SHA-256 of the blob id, and
any unique prefix of at least 4 hex digits of that hash names it too (restic's model: one id a user
can type, derived from the name, so every snapshot has one, old or new, CLI backup or Spark query).
`latest` names the newest snapshot of one store (by label: zero-padded times, so name order is time
order). Resolving never reads an index; listing reads them only when asked (`load`).

History: a CLI backup (query `cli`) never deletes an older snapshot. `forget` deletes the indexes
of the CLI snapshots a policy no longer keeps (restic's --keep-last N and --keep-within DURATION,
per store; the newest snapshot of a store is always kept by either rule), and `gc` then deletes the
blobs no remaining snapshot or retained checkpoint references (gc.py). Snapshots of Spark queries are
kept by spark.statebackend.retainCheckpoints and collected by gc; forget refuses them.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial

from ..engine.blobs import CLI_QUERY, load_snapshot_index
from ..engine.index import SnapshotIndex
from ..engine.transfer import TransferPool
from ..errors import ConfigError, StateBackendError
from ..stores import BlobStore

__all__ = [
    "CLI_QUERY",
    "ForgetPlan",
    "Snapshot",
    "SnapshotRefError",
    "list_snapshots",
    "load_indexes",
    "plan_forget",
    "resolve",
]

SHORT_ID_LEN = 8
MIN_PREFIX_LEN = 4
_HEX = re.compile(r"[0-9a-f]+")


class SnapshotRefError(ConfigError):
    """A snapshot reference on the command line names no snapshot, or more than one (a usage error:
    the message says what to type instead)."""


@dataclass(frozen=True)
class Snapshot:
    """One SnapshotIndex blob, from its name alone; `index` once loaded (load_indexes)."""

    blob_id: str
    query: str
    store: str  # the store's blob segment (a Spark store key keeps its slashes: 0/3/default)
    label: str  # the checkpoint label: names sort by it in time order
    modified_ms: int
    index: SnapshotIndex | None = None

    @property
    def full_id(self) -> str:
        """SHA-256 of the blob id, hex: what short ids are prefixes of."""
        return hashlib.sha256(self.blob_id.encode()).hexdigest()

    @property
    def short_id(self) -> str:
        return self.full_id[:SHORT_ID_LEN]

    @property
    def created_ms(self) -> int:
        """When the snapshot was taken (its index's created_at_ms; the blob's mtime until loaded)."""
        return self.index.created_at_ms if self.index is not None else self.modified_ms

    def key(self) -> tuple[str, str]:
        """(query, store): the snapshots `latest` and forget policies are counted within."""
        return self.query, self.store


def parse_snapshot_blob_id(blob_id: str, modified_ms: int = 0) -> Snapshot | None:
    """The Snapshot a blob id names, or None if it is not `indexes/<query>/<store>/<name>.json`."""
    if not blob_id.startswith("indexes/") or not blob_id.endswith(".json"):
        return None
    parts = blob_id[len("indexes/") :].split("/")
    if len(parts) < 3 or not all(parts):
        return None
    name = parts[-1][: -len(".json")]
    label = name.rpartition("-")[0] or name
    return Snapshot(blob_id, parts[0], "/".join(parts[1:-1]), label, modified_ms)


def list_snapshots(
    store: BlobStore, *, query: str | None = None, store_name: str | None = None
) -> list[Snapshot]:
    """Every snapshot in `store` (of `query` / of store `store_name` if given), oldest first within
    each store; nothing is read but the listing."""
    from ..engine.blobs import blob_segment

    prefix = f"indexes/{blob_segment(query)}/" if query is not None else "indexes/"
    want_store = blob_segment(store_name) if store_name is not None else None
    out = []
    for info in store.list(prefix):
        snap = parse_snapshot_blob_id(info.blob_id, info.modified_ms)
        if snap is None or (want_store is not None and snap.store != want_store):
            continue
        out.append(snap)
    return sorted(out, key=lambda s: (s.query, s.store, s.label, s.blob_id))


def load_indexes(
    store: BlobStore,
    pool: TransferPool,
    snapshots: Sequence[Snapshot],
    *,
    on_loaded: Callable[[], None] | None = None,
) -> tuple[list[Snapshot], list[str]]:
    """Read every snapshot's index in parallel: (the loaded snapshots, a warning per unreadable one).
    A snapshot deleted since the listing is dropped silently (a concurrent forget)."""
    from ..errors import BlobNotFoundError

    def load(snap: Snapshot) -> Snapshot | str | None:
        try:
            return Snapshot(
                snap.blob_id,
                snap.query,
                snap.store,
                snap.label,
                snap.modified_ms,
                load_snapshot_index(store, snap.blob_id),
            )
        except BlobNotFoundError:
            return None
        except StateBackendError as e:
            return str(e)
        finally:
            if on_loaded is not None:
                on_loaded()

    loaded: list[Snapshot] = []
    problems: list[str] = []
    for result in pool.run_all([partial(load, s) for s in snapshots]):
        if isinstance(result, Snapshot):
            loaded.append(result)
        elif isinstance(result, str):
            problems.append(result)
    return loaded, problems


def _describe(snaps: Iterable[Snapshot], limit: int = 5) -> str:
    items = list(snaps)
    shown = ", ".join(f"{s.short_id} ({s.query} {s.store} {s.label})" for s in items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def resolve(
    store: BlobStore,
    ref: str,
    *,
    store_name: str | None = None,
    query: str | None = None,
    key: str = "SNAPSHOT",
) -> Snapshot:
    """The snapshot `ref` names: a full blob id (`indexes/...json`, used as given), `latest` (the
    newest snapshot of the one store matching `store_name`/`query`), or a unique prefix of at least
    4 hex digits of a snapshot id.

    Raises SnapshotRefError naming `key` for an ambiguous or malformed reference, StateBackendError
    when nothing matches."""
    text = ref.strip()
    if text.startswith("indexes/"):
        snap = parse_snapshot_blob_id(text)
        if snap is None:
            raise SnapshotRefError(
                key, f"{ref!r} is not a snapshot blob id (indexes/<query>/<store>/<name>.json)"
            )
        return snap
    if text == "latest":
        candidates = list_snapshots(store, query=query, store_name=store_name)
        where = _filter_text(store_name, query)
        if not candidates:
            raise StateBackendError(f"no snapshots{where} in {store.url}")
        stores = sorted({s.key() for s in candidates})
        if len(stores) > 1:
            names = ", ".join(f"{s}" if q == CLI_QUERY else f"{s} (query {q})" for q, s in stores[:8])
            more = f" and {len(stores) - 8} more" if len(stores) > 8 else ""
            raise SnapshotRefError(
                key,
                f"'latest' is ambiguous: {len(stores)} stores have snapshots{where} ({names}{more}); "
                "name one with --store" + ("" if query is not None else " (and --query)"),
            )
        return max(candidates, key=lambda s: (s.label, s.blob_id))
    lowered = text.lower()
    if not _HEX.fullmatch(lowered) or not MIN_PREFIX_LEN <= len(lowered) <= 64:
        raise SnapshotRefError(
            key,
            f"{ref!r} is not a snapshot: give 'latest', a snapshot id (at least {MIN_PREFIX_LEN} hex "
            "digits, as `snapshots` prints it) or a blob id indexes/...json",
        )
    matches = [
        s for s in list_snapshots(store, query=query, store_name=store_name) if s.full_id.startswith(lowered)
    ]
    if not matches:
        raise StateBackendError(
            f"no snapshot id starts with {lowered}{_filter_text(store_name, query)} in {store.url}"
        )
    if len(matches) > 1:
        raise SnapshotRefError(
            key,
            f"snapshot id prefix {lowered!r} is ambiguous: it matches {len(matches)} snapshots "
            f"({_describe(matches)}); give more digits",
        )
    return matches[0]


def _filter_text(store_name: str | None, query: str | None) -> str:
    parts = []
    if store_name is not None:
        parts.append(f"store {store_name}")
    if query is not None:
        parts.append(f"query {query}")
    return (" of " + ", ".join(parts)) if parts else ""


# -- forget ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ForgetPlan:
    """Which snapshots a policy keeps and which it removes, each oldest first."""

    keep: tuple[Snapshot, ...]
    remove: tuple[Snapshot, ...]


def plan_forget(
    snapshots: Iterable[Snapshot],
    *,
    keep_last: int | None = None,
    keep_within_ms: int | None = None,
    remove_ids: Iterable[str] = (),
) -> ForgetPlan:
    """Apply a restic-style policy to loaded CLI snapshots, per (query, store):

    - keep_last N: keep the N newest snapshots (N >= 1);
    - keep_within D: keep every snapshot taken within D of the store's newest snapshot (not of now,
      so an idle store is never emptied);
    - a snapshot is kept if any given rule keeps it; with no rule, everything is kept except the
      snapshots named in `remove_ids` (blob ids), which are removed whatever the rules say.

    Raises ConfigError for a snapshot of a Spark query (those follow retainCheckpoints)."""
    if keep_last is not None and keep_last < 1:
        raise ConfigError("--keep-last", f"must be at least 1, got {keep_last}")
    explicit = set(remove_ids)
    by_store: dict[tuple[str, str], list[Snapshot]] = {}
    for snap in snapshots:
        if snap.query != CLI_QUERY:
            raise ConfigError(
                "SNAPSHOT",
                f"{snap.short_id} ({snap.blob_id}) belongs to Spark query {snap.query}: its snapshots are "
                "kept by spark.statebackend.retainCheckpoints and collected by gc, not forgotten",
            )
        by_store.setdefault(snap.key(), []).append(snap)
    keep: list[Snapshot] = []
    remove: list[Snapshot] = []
    policy = keep_last is not None or keep_within_ms is not None
    for key in sorted(by_store):
        snaps = sorted(by_store[key], key=lambda s: (s.created_ms, s.label, s.blob_id))
        newest_ms = snaps[-1].created_ms
        for i, snap in enumerate(snaps):
            kept = not policy
            if keep_last is not None and i >= len(snaps) - keep_last:
                kept = True
            if keep_within_ms is not None and snap.created_ms >= newest_ms - keep_within_ms:
                kept = True
            if snap.blob_id in explicit:
                kept = False
            (keep if kept else remove).append(snap)
    return ForgetPlan(tuple(keep), tuple(remove))


def group_by_store(snaps: Iterable[Snapshot]) -> dict[tuple[str, str], list[Snapshot]]:
    """Snapshots grouped by (query, store), each group oldest first."""
    out: dict[tuple[str, str], list[Snapshot]] = {}
    for s in snaps:
        out.setdefault(s.key(), []).append(s)
    for group in out.values():
        group.sort(key=lambda s: (s.created_ms, s.label, s.blob_id))
    return out
