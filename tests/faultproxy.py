"""A small TCP proxy for fault injection between a blob store client and a real server.

    with FaultProxy(server_port) as proxy:          # listens on 127.0.0.1:proxy.port
        store = open_blob_store(url, options_through(proxy.port))
        proxy.answer_503(seconds=1.0)               # every request gets HTTP 503 for a second
        proxy.stall(seconds=1.5)                    # bytes stop flowing, both ways
        proxy.refuse(seconds=1.0)                   # connections are reset as soon as they open
        proxy.cut_downstream_after(300_000, times=2)  # reset after 300 kB of a response, twice
        proxy.cut_upstream_after(300_000, times=1)    # reset after 300 kB of a request body, once
        proxy.lose_response(rb"^PUT ", times=1)     # forward a matching request, drop its answer

Each fault lasts `seconds` (None: until `heal()`), measured on the monotonic clock by the pump
threads themselves, so tests never sleep to wait for a fault to end. Switching to 503, refuse or a
healthy state resets the connections already open, so pooled keep-alive connections cannot bypass
a fault. Counters in `proxy.stats` let tests assert that a fault really happened.

Real TCP, real servers: nothing about the clients or the services is mocked.
"""

from __future__ import annotations

import contextlib
import re
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

PASS, STALL, ANSWER_503, REFUSE = "pass", "stall", "503", "refuse"
_POLL = 0.02  # how often a pump looks at the fault state while idle
_BODY_503 = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>ServerBusy</Code>'
    b"<Message>injected by the test fault proxy</Message></Error>"
)


@dataclass
class Stats:
    connections: int = 0
    answered_503: int = 0
    refused: int = 0
    cuts: int = 0
    lost_responses: int = 0
    stalled_connections: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, name: str, n: int = 1) -> None:
        with self.lock:
            setattr(self, name, getattr(self, name) + n)


def _reset(sock: socket.socket) -> None:
    """Close with RST (SO_LINGER 0): the peer sees 'connection reset', as with a dropped link."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


class _Conn:
    def __init__(self, client: socket.socket) -> None:
        self.client = client
        self.upstream: socket.socket | None = None
        self.killed = threading.Event()
        self.lose_next_response = False
        self.was_stalled = False


class FaultProxy:
    """Forwards 127.0.0.1:port to the upstream server, injecting faults on request (module doc)."""

    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.stats = Stats()
        self._lock = threading.Lock()
        self._mode = PASS
        self._until: float | None = None
        self._cut_down: tuple[int, int] | None = None  # (after n bytes, times left)
        self._cut_up: tuple[int, int] | None = None
        self._lose: tuple[re.Pattern[bytes], int] | None = None
        self._conns: set[_Conn] = set()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self.port = int(self._listener.getsockname()[1])
        self._closed = threading.Event()
        self._acceptor = threading.Thread(
            target=self._accept_loop, name=f"faultproxy-{self.port}", daemon=True
        )
        self._acceptor.start()

    # ---- controls

    def _set(self, mode: str, seconds: float | None, reset_open: bool) -> None:
        with self._lock:
            self._mode = mode
            self._until = None if seconds is None else time.monotonic() + seconds
            conns = list(self._conns) if reset_open else []
        for c in conns:
            self._kill(c)

    def heal(self) -> None:
        """Stop every fault; open connections continue (stalled ones resume)."""
        with self._lock:
            self._mode, self._until = PASS, None
            self._cut_down = self._cut_up = self._lose = None

    def answer_503(self, seconds: float | None = None) -> None:
        """Answer every request with HTTP 503 (ServerBusy) for `seconds`."""
        self._set(ANSWER_503, seconds, reset_open=True)

    def refuse(self, seconds: float | None = None) -> None:
        """Reset every connection as soon as it is accepted, and the open ones now."""
        self._set(REFUSE, seconds, reset_open=True)

    def stall(self, seconds: float | None = None) -> None:
        """Forward nothing in either direction for `seconds`; connections stay open."""
        self._set(STALL, seconds, reset_open=False)

    def drop_all(self) -> None:
        """Reset every open connection once, now."""
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            self._kill(c)

    def cut_downstream_after(self, nbytes: int, times: int = 1) -> None:
        """The next `times` responses are reset after `nbytes` of them reached the client."""
        with self._lock:
            self._cut_down = (nbytes, times)

    def cut_upstream_after(self, nbytes: int, times: int = 1) -> None:
        """The next `times` connections are reset after `nbytes` of request data reached the server."""
        with self._lock:
            self._cut_up = (nbytes, times)

    def lose_response(self, request_pattern: bytes, times: int = 1) -> None:
        """Forward the next `times` requests whose first bytes match `request_pattern` (a regex on
        the request line and headers), then reset the connection instead of passing their answer."""
        with self._lock:
            self._lose = (re.compile(request_pattern, re.DOTALL), times)

    def close(self) -> None:
        self._closed.set()
        self._acceptor.join(timeout=5)
        with contextlib.suppress(OSError):
            self._listener.close()
        self.drop_all()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- machinery

    def _mode_now(self) -> str:
        with self._lock:
            if self._until is not None and time.monotonic() >= self._until:
                self._mode, self._until = PASS, None
            return self._mode

    def _take(self, attr: str) -> int | None:
        """Consume one use of a counted fault; returns its byte threshold, or None if none is armed."""
        with self._lock:
            armed = getattr(self, attr)
            if armed is None:
                return None
            n, left = armed
            setattr(self, attr, (n, left - 1) if left > 1 else None)
            return int(n)

    def _kill(self, c: _Conn) -> None:
        c.killed.set()
        _reset(c.client)
        if c.upstream is not None:
            _reset(c.upstream)

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                # Polled, because closing a listening socket does not wake a thread blocked in accept().
                ready, _, _ = select.select([self._listener], [], [], _POLL * 5)
                if not ready:
                    continue
                client, _ = self._listener.accept()
            except (OSError, ValueError):
                return
            self.stats.add("connections")
            threading.Thread(target=self._serve, args=(client,), name="faultproxy-conn", daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        mode = self._mode_now()
        if mode == REFUSE:
            self.stats.add("refused")
            _reset(client)
            return
        if mode == ANSWER_503:
            self._answer_503(client)
            return
        c = _Conn(client)
        try:
            c.upstream = socket.create_connection(self.upstream, timeout=5)
        except OSError:
            _reset(client)
            return
        with self._lock:
            self._conns.add(c)
        try:
            self._pump(c)
        except OSError:
            pass
        finally:
            with self._lock:
                self._conns.discard(c)
            self._kill(c)

    def _pump(self, c: _Conn) -> None:
        assert c.upstream is not None
        up_budget: int | None = None  # bytes left before this connection's request is cut
        down_budget: int | None = None
        while not c.killed.is_set() and not self._closed.is_set():
            mode = self._mode_now()
            if mode == STALL:
                if not c.was_stalled:
                    c.was_stalled = True
                    self.stats.add("stalled_connections")
                c.killed.wait(_POLL)
                continue
            if mode in (ANSWER_503, REFUSE):
                return  # the switch already reset us; a late pump just ends
            readable, _, _ = select.select([c.client, c.upstream], [], [], _POLL)
            for sock in readable:
                data = sock.recv(256 * 1024)
                if not data:
                    return
                if sock is c.client:
                    if self._lose is not None and self._matches_lose(data):
                        c.lose_next_response = True
                    if up_budget is None:
                        up_budget = self._take("_cut_up")
                    if up_budget is not None:
                        if len(data) >= up_budget:
                            c.upstream.sendall(data[:up_budget])
                            self.stats.add("cuts")
                            return
                        up_budget -= len(data)
                    c.upstream.sendall(data)
                    self.stats.add("bytes_up", len(data))
                else:
                    if c.lose_next_response:
                        self.stats.add("lost_responses")
                        return
                    if down_budget is None:
                        down_budget = self._take("_cut_down")
                    if down_budget is not None:
                        if len(data) >= down_budget:
                            c.client.sendall(data[:down_budget])
                            self.stats.add("cuts")
                            return
                        down_budget -= len(data)
                    c.client.sendall(data)
                    self.stats.add("bytes_down", len(data))

    def _matches_lose(self, data: bytes) -> bool:
        with self._lock:
            if self._lose is None:
                return False
            pattern, left = self._lose
            if not pattern.search(data[:8192]):
                return False
            self._lose = (pattern, left - 1) if left > 1 else None
            return True

    def _answer_503(self, client: socket.socket) -> None:
        """Read one request (headers, and a body unless the client waits for 100-continue), then
        answer 503 and close, as a throttled front end does."""
        try:
            client.settimeout(5)
            head = b""
            while b"\r\n\r\n" not in head:
                piece = client.recv(65536)
                if not piece:
                    return
                head += piece
            headers, _, body = head.partition(b"\r\n\r\n")
            lower = headers.lower()
            length_match = re.search(rb"\r\ncontent-length:\s*(\d+)", lower)
            if length_match and b"expect: 100-continue" not in lower:
                remaining = int(length_match.group(1)) - len(body)
                while remaining > 0:
                    piece = client.recv(min(remaining, 1 << 20))
                    if not piece:
                        return
                    remaining -= len(piece)
            client.sendall(
                b"HTTP/1.1 503 Service Unavailable\r\n"
                b"Content-Type: application/xml\r\n"
                b"x-ms-error-code: ServerBusy\r\n"
                b"Retry-After: 1\r\n"
                b"Connection: close\r\n"
                b"Content-Length: " + str(len(_BODY_503)).encode() + b"\r\n\r\n" + _BODY_503
            )
            self.stats.add("answered_503")
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                client.close()
