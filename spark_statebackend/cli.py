"""The `spark-statebackend` command line: backup, restore, verify, snapshots, checkpoints, gc.

Errors exit non-zero with one clear line on stderr; `--debug` shows the traceback instead.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import click

from .errors import StateBackendError


class _Group(click.Group):
    """Turns our errors into one line on stderr and exit code 1 (a traceback only with --debug)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (StateBackendError, OSError, ValueError) as e:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            click.echo(f"error: {e}", err=True)
            sys.exit(1)


@click.group(cls=_Group)
@click.option("--debug", is_flag=True, help="Show tracebacks and debug logs.")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """Blob-store backup and restore of RocksDB state for Spark Structured Streaming."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


# -- snapshot commands (core engine) --


# -- checkpoints command (checkpoint log) --
