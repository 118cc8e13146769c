"""The checkpoint log's interface: the CheckpointLog contract (stated in logs/__init__.py) and its
errors. Its own module so that the implementations (file.py, kafka.py) and `open_checkpoint_log`, which
picks one of them, all import it without a circle."""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType

from ...errors import CheckpointError
from ..checkpoint import CheckpointV2


class CheckpointLogError(CheckpointError):
    """A checkpoint log operation failed (unreachable, timed out, misconfigured resource).

    `outcome_unknown` is True when a write may or may not have been committed (a commit timed out);
    either way the caller must not act as if it had been."""

    def __init__(self, message: str, *, outcome_unknown: bool = False) -> None:
        super().__init__(message)
        self.outcome_unknown = outcome_unknown


class CheckpointFencedError(CheckpointLogError):
    """A newer writer for the same query exists; this writer can never write that query again."""


class CheckpointLog(ABC):
    """Abstract checkpoint log; see logs/__init__.py for the contract."""

    #: The log's URL with any secret removed; safe to log.
    url: str

    @abstractmethod
    def create_resources(self) -> None:
        """Create the directory or topic if missing, then validate_resources()."""

    @abstractmethod
    def validate_resources(self) -> None:
        """Check that the log exists and is usable; raise CheckpointLogError naming what is wrong."""

    @abstractmethod
    def acquire_writer(self, query_id: str) -> None:
        """Fence every earlier writer of `query_id`; this instance becomes its only writer.
        Idempotent on an instance that already is the writer; an instance that was fenced raises
        CheckpointFencedError (a fenced driver must stop, not reclaim the query)."""

    @abstractmethod
    def write(self, checkpoint: CheckpointV2) -> None:
        """Durably append `checkpoint` to its query's log; see the contract for failure semantics."""

    @abstractmethod
    def read_latest(self, query_id: str) -> CheckpointV2 | None:
        """The newest committed checkpoint of `query_id`, or None if there is none."""

    @abstractmethod
    def read_history(self, query_id: str) -> list[CheckpointV2]:
        """Every retained checkpoint of `query_id`, oldest first."""

    def retain(self, query_id: str, keep_last: int) -> int:
        """Delete all but the newest `keep_last` (>= 1) checkpoints of `query_id` where the log
        supports deletion; return how many were deleted. The default keeps everything."""
        if keep_last < 1:
            raise ValueError(
                f"keep_last={keep_last} must be at least 1: the latest checkpoint is never deleted"
            )
        return 0

    def close(self) -> None:  # noqa: B027 - optional hook, most logs hold nothing to release
        """Release clients and files. Idempotent."""

    def __enter__(self) -> CheckpointLog:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"
