"""Checksums of chunks and files, computed while bytes stream through (never a second read).

CRC32C was chosen over xxhash because S3 computes and verifies the same algorithm natively
(x-amz-checksum-crc32c) and it is hardware-accelerated (SSE4.2/ARMv8 CRC). It comes from
`google-crc32c` (Apache-2.0, like this package; the `crc32c` package it replaced is LGPL), which
releases the GIL while it hashes a `bytes` of 1 MiB or more, so parallel transfer threads checksum
concurrently. It takes `bytes` only: other buffers are hashed in copied blocks (`crc_update`).

Formats:
- a chunk:  "crc32c:<8 hex digits>" over the chunk's bytes;
- a file:   the chunk checksum if the file has one chunk, "crc32c:00000000" if it is empty, and
  otherwise "crc32c-composite:<8 hex>-<n>": CRC32C over the n big-endian chunk CRCs, in order (the
  scheme S3 uses for multipart checksums). The file checksum therefore depends on the chunk layout,
  and comparisons against a stored file always recompute with that file's layout.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import BinaryIO

import google_crc32c as _crc32c

#: Files are read, and buffers other than bytes copied, in blocks of this size: at least the 1 MiB from
#: which google-crc32c releases the GIL, small enough to keep the copies' memory bounded.
_READ_BLOCK = 4 * 1024 * 1024


def crc_update(crc: int, data: bytes | bytearray | memoryview) -> int:
    """Extend a running CRC32C with `data`, any C-contiguous buffer (a bytearray, an mmap's view).

    `bytes` are hashed in place; google-crc32c takes nothing else (a bytearray or a memoryview raises
    TypeError), so any other buffer is hashed in copied `_READ_BLOCK` blocks."""
    if isinstance(data, bytes):
        return int(_crc32c.extend(crc, data))
    # Released on return: the caller may close the buffer's owner (an mmap) right after.
    with memoryview(data) as whole, whole.cast("B") as view:
        for off in range(0, len(view), _READ_BLOCK):
            crc = int(_crc32c.extend(crc, view[off : off + _READ_BLOCK].tobytes()))
    return crc


def format_crc(crc: int) -> str:
    """The stored form of a chunk checksum."""
    return f"crc32c:{crc & 0xFFFFFFFF:08x}"


def _parse_crc(text: str) -> int:
    if not text.startswith("crc32c:") or len(text) != 15:
        raise ValueError(f"not a chunk checksum: {text!r}")
    return int(text[7:], 16)


def file_checksum(chunk_checksums: Sequence[str]) -> str:
    """The file checksum for a file made of chunks with these checksums (see module doc)."""
    if not chunk_checksums:
        return format_crc(0)
    if len(chunk_checksums) == 1:
        return chunk_checksums[0]
    crc = 0
    for c in chunk_checksums:
        crc = crc_update(crc, _parse_crc(c).to_bytes(4, "big"))
    return f"crc32c-composite:{crc:08x}-{len(chunk_checksums)}"


def chunk_layout(size: int, chunk_size: int) -> list[tuple[int, int]]:
    """Split `size` bytes into (offset, length) chunks of at most `chunk_size`; none for an empty file."""
    if chunk_size <= 0:
        raise ValueError("chunk size must be positive")
    return [(off, min(chunk_size, size - off)) for off in range(0, size, chunk_size)]


def checksum_range(path: str | os.PathLike[str], offset: int, length: int) -> str:
    """Chunk checksum of bytes [offset, offset+length) of a local file."""
    with open(path, "rb") as f:
        return checksum_open_range(f, offset, length, str(path))


def checksum_open_range(f: BinaryIO, offset: int, length: int, label: str) -> str:
    """Chunk checksum of bytes [offset, offset+length) of the open file `f` (named `label` in errors)."""
    crc = 0
    f.seek(offset)
    remaining = length
    while remaining:
        block = f.read(min(_READ_BLOCK, remaining))
        if not block:
            raise OSError(f"{label}: ended {remaining} bytes early")
        crc = crc_update(crc, block)
        remaining -= len(block)
    return format_crc(crc)


def local_file_checksum(path: str | os.PathLike[str], layout: Iterable[tuple[int, int]]) -> str:
    """File checksum of a local file read with the given chunk layout."""
    return file_checksum([checksum_range(path, off, n) for off, n in layout])


class ChecksumReader:
    """A read-only stream over bytes [offset, offset+length) of a file that checksums what it serves.

    Readers that seek back to the start (an SDK rewinding for its own retry or checksum pass) reset
    the CRC; any other seek marks it untrusted, and the caller must recompute it from the file."""

    def __init__(self, raw: BinaryIO, offset: int, length: int) -> None:
        self._raw = raw
        self._start = offset
        self._length = length
        self._pos = 0
        self.crc = 0
        self.trusted = True
        raw.seek(offset)

    def read(self, n: int = -1) -> bytes:
        remaining = self._length - self._pos
        if n is None or n < 0 or n > remaining:
            n = remaining
        if n == 0:
            return b""
        data = self._raw.read(n)
        self.crc = crc_update(self.crc, data)
        self._pos += len(data)
        return data

    def readinto(self, buf: bytearray | memoryview) -> int:
        data = self.read(len(buf))
        buf[: len(data)] = data
        return len(data)

    @property
    def bytes_read(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = os.SEEK_SET) -> int:
        if whence == os.SEEK_CUR:
            pos = self._pos + pos
        elif whence == os.SEEK_END:
            pos = self._length + pos
        pos = max(0, min(pos, self._length))
        if pos == 0:
            self.crc = 0
            self.trusted = True
        elif pos != self._pos:
            self.trusted = False
        self._pos = pos
        self._raw.seek(self._start + pos)
        return pos

    def tell(self) -> int:
        return self._pos

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self._raw.close()

    def __enter__(self) -> ChecksumReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        return self._length


class ChecksumWriter:
    """Writes sequentially at a file offset with pwrite, checksumming every byte as it is written."""

    def __init__(self, fd: int, offset: int) -> None:
        self._fd = fd
        self._pos = offset
        self.crc = 0
        self.written = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        self.crc = crc_update(self.crc, data)  # `data`, not the view: bytes are hashed without a copy
        view = memoryview(data)
        while view:
            n = os.pwrite(self._fd, view, self._pos)
            self._pos += n
            self.written += n
            view = view[n:]
        return len(data)


class ChecksumSink:
    """Discards bytes, keeping only their checksum and count (verify without writing)."""

    def __init__(self) -> None:
        self.crc = 0
        self.written = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        self.crc = crc_update(self.crc, data)
        self.written += len(data)
        return len(data)
