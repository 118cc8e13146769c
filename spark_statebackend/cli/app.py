"""The `spark-statebackend` command group: its global flags, exit codes and error handling (the
conventions are in cli/__init__.py). The commands are in snapshots.py, history.py and checkpoints.py.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, NoReturn

import click

from .. import __version__
from ..errors import ConfigError, StateBackendError

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_PROBLEMS = 3
EXIT_INTERRUPTED = 130


class _Group(click.Group):
    """Turns our errors into one line on stderr and the documented exit codes (module doc)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except ConfigError as e:  # a bad flag, option, URL or snapshot id: the user must fix the line
            _fail(ctx, e, EXIT_USAGE)
        except (StateBackendError, OSError, ValueError) as e:
            _fail(ctx, e, EXIT_ERROR)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)


def _fail(ctx: click.Context, error: Exception, code: int) -> NoReturn:
    if ctx.obj and ctx.obj.get("debug"):
        raise error
    click.echo(f"error: {error}", err=True)
    sys.exit(code)


@click.group(cls=_Group)
@click.version_option(__version__, "--version", prog_name="spark-statebackend")
@click.option("--debug", is_flag=True, help="Show tracebacks and debug logs.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bars and no summaries on stderr.")
@click.pass_context
def main(ctx: click.Context, debug: bool, quiet: bool) -> None:
    """Blob-store backup and restore of RocksDB state for Spark Structured Streaming.

    Exit codes: 0 ok, 1 failed, 2 usage error, 3 problems found (verify, gc), 130 interrupted."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    ctx.obj["quiet"] = quiet
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
