"""CRC32C (engine/checksum.py): the values stored in every index and checkpoint must not change with
the library that computes them. Checked against the published iSCSI test vectors and a bitwise
implementation of the polynomial written here, for every kind of buffer the engine hashes."""

from __future__ import annotations

import mmap
import os
import random
from pathlib import Path

import pytest

from spark_statebackend.engine.checksum import (
    ChecksumSink,
    ChecksumWriter,
    crc_update,
    file_checksum,
    format_crc,
    local_file_checksum,
)

_POLY = 0x82F63B78  # CRC32C (Castagnoli), reflected


def _reference_crc32c(data: bytes, crc: int = 0) -> int:
    """CRC32C one bit at a time, straight from the polynomial (slow: small inputs only)."""
    crc ^= 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (_POLY if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", 0x00000000),
        (b"123456789", 0xE3069283),  # the CRC catalogue's check value
        (bytes(32), 0x8A9136AA),  # RFC 3720 B.4: 32 bytes of zeros
        (b"\xff" * 32, 0x62A8AB43),  # ... of ones
        (bytes(range(32)), 0x46DD794E),  # ... incrementing
        (bytes(range(31, -1, -1)), 0x113FDB5C),  # ... decrementing
    ],
)
def test_published_vectors(data: bytes, expected: int) -> None:
    assert _reference_crc32c(data) == expected  # the reference itself is right
    assert crc_update(0, data) == expected
    assert format_crc(crc_update(0, data)) == f"crc32c:{expected:08x}"


def test_random_data_matches_the_polynomial_whole_and_in_pieces() -> None:
    rng = random.Random(20261126)
    for size in (1, 7, 64, 1000, 4096, 20_000):
        data = rng.randbytes(size)
        expected = _reference_crc32c(data)
        assert crc_update(0, data) == expected, size
        cut = rng.randrange(size + 1)
        assert crc_update(crc_update(0, data[:cut]), data[cut:]) == expected, (size, cut)


def test_every_buffer_kind_gives_the_same_crc_across_copy_blocks(tmp_path: Path) -> None:
    """Only bytes reach the library as they are; bytearrays, memoryviews (ChecksumWriter's input) and
    mmaps (restore verification) are hashed in 4 MiB copied blocks, so cross that boundary."""
    data = random.Random(7).randbytes(9 * 1024 * 1024 + 3)
    expected = crc_update(0, data[:1000])
    expected = crc_update(expected, data[1000:])  # bytes in two calls: the library's own chaining
    assert crc_update(0, bytearray(data)) == expected
    assert crc_update(0, memoryview(data)) == expected
    assert crc_update(0, memoryview(bytearray(data))[5:]) == crc_update(0, data[5:])
    path = tmp_path / "f"
    path.write_bytes(data)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mm, memoryview(mm) as view:
        assert crc_update(0, view) == expected
    # Leaving the block closed the mapping: a view crc_update had kept of it would raise BufferError.
    fd = os.open(tmp_path / "copy", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        writer = ChecksumWriter(fd, 0)
        writer.write(memoryview(data)[:3000])
        writer.write(bytearray(data[3000:]))
    finally:
        os.close(fd)
    assert writer.crc == expected and (tmp_path / "copy").read_bytes() == data
    sink = ChecksumSink()
    sink.write(data)
    assert sink.crc == expected


def test_file_checksums_are_unchanged(tmp_path: Path) -> None:
    """Stored file checksums (single chunk, composite, empty) recompute to the same text."""
    data = random.Random(3).randbytes(64 * 1024)
    path = tmp_path / "f"
    path.write_bytes(data)
    assert local_file_checksum(path, [(0, len(data))]) == f"crc32c:{_reference_crc32c(data):08x}"
    layout = [(off, 16 * 1024) for off in range(0, len(data), 16 * 1024)]
    chunk_crcs = [_reference_crc32c(data[off : off + n]) for off, n in layout]
    composite = _reference_crc32c(b"".join(c.to_bytes(4, "big") for c in chunk_crcs))
    assert local_file_checksum(path, layout) == f"crc32c-composite:{composite:08x}-4"
    assert file_checksum([f"crc32c:{c:08x}" for c in chunk_crcs]) == f"crc32c-composite:{composite:08x}-4"
    assert file_checksum([]) == "crc32c:00000000"
