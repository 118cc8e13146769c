"""The `spark-statebackend` command line: backup, restore, verify, snapshots, forget, checkpoints, gc,
restore-checkpoint, export.

Conventions (README "Command line", in full in docs/cli.md):
- Exit codes: 0 success; 1 the command failed (unreachable or missing store, snapshot not found, I/O
  error, refused destination); 2 usage error (unknown flag, malformed value, unknown option, bad URL,
  ambiguous snapshot id); 3 the command ran and found problems (verify: damaged snapshot; gc: some
  blobs kept because an index is unreadable, or deletes failed); 130 interrupted. Errors are one line
  on stderr; `--debug` shows the traceback instead.
- Read-only commands (restore's reads, verify, snapshots, checkpoints, forget --dry-run, gc --dry-run)
  never create a blob store or checkpoint log: a file:// URL naming a missing directory fails (a typo
  must not look like an empty store). `backup` creates its store on first use.
- `--json` prints JSON Lines on stdout: one object per snapshot or checkpoint for listings, one object
  for a report. Progress bars go to stderr, only on a terminal, never with --quiet or --json.
- Durations and sizes use Spark's grammar (common/units.py): --ttl 7d, --grace 6h, --chunk-size 64m.

The group and its error handling are app.py; the commands: snapshots.py (backup, restore, verify),
history.py (snapshots, forget), checkpoints.py (restore-checkpoint, export, checkpoints, gc); options.py holds
what they share. Each command imports the engine only when it runs, so `--help` stays quick.
"""

from . import checkpoints, history, snapshots  # noqa: F401  (each registers its commands on `main`)
from .app import main

__all__ = ["main"]
