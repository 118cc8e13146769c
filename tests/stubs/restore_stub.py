"""A thread that plays the sidecar's restore role in the test process.

It registers itself as the spool dir's live sidecar (sidecar.json with the test process' pid) and
answers every restore request with whatever `answer` returns, following the protocol in
spark_statebackend.runtime.spool: write the response, then remove the request.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from spark_statebackend.runtime import spool
from spark_statebackend.runtime.spool import RestoreRequest, RestoreResponse, Spool

Answer = Callable[[RestoreRequest], RestoreResponse]


class RestoreStub:
    """Answers restore requests in one executor spool dir until stopped."""

    def __init__(self, spool_dir: Path, answer: Answer, executor_id: str = "driver") -> None:
        self.spool = Spool(spool_dir)
        self.answer = answer
        self.executor_id = executor_id
        self.requests: list[RestoreRequest] = []
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="restore-stub", daemon=True)

    def __enter__(self) -> RestoreStub:
        self.spool.dir.mkdir(parents=True, exist_ok=True)
        self.spool.write_sidecar_marker(self.executor_id)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.spool.remove_sidecar_marker()
        if self.errors:
            raise self.errors[0]

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for path in self.spool.pending_requests():
                    request = spool.read_request(path)
                    self.requests.append(request)
                    self.spool.write_response(self.answer(request))
                    spool.remove(path)
            except BaseException as e:  # reported by __exit__
                self.errors.append(e)
                return
            self._stop.wait(0.01)


def copy_back(saved: Mapping[tuple[str, int], Path]) -> Answer:
    """An answer that restores (dfs_dir, version) from a saved copy of its staged dir."""

    def answer(request: RestoreRequest) -> RestoreResponse:
        source = saved.get((str(request.dfs_dir), request.version))
        if source is None:
            return RestoreResponse(request.request_id, "not_found", f"nothing saved for {request.dfs_dir}")
        n = size = 0
        for f in sorted(p for p in source.rglob("*") if p.is_file()):
            dst = request.dfs_dir / f.relative_to(source)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dst)
            n += 1
            size += f.stat().st_size
        return RestoreResponse(request.request_id, "restored", "copied by the test stub", files=n, bytes=size)

    return answer


def not_found(request: RestoreRequest) -> RestoreResponse:
    """An answer for a blob store that has nothing."""
    return RestoreResponse(request.request_id, "not_found", "no snapshot in the (stub) blob store")
