"""Placing a restored file ([R4]-[R5] of engine/__init__.py): the local fast path, and the
permissions and mtime a restore gives what it wrote.

Local fast path: a file stored as one whole blob of a store that keeps blobs as local files
(LocalBlobStore) on the restore's filesystem is not copied through Python. Its task hard-links the blob
file into place, or else copies it in the kernel (copy_file_range, a reflink where the filesystem can),
then reads it back from the page cache and verifies its CRC32C against the index: a corrupt blob raises
ChecksumError naming the file like a download would. Anything else (missing or resized blob, another
filesystem, a link refused) takes the download path, which raises its errors.

A link shares the blob's inode, so a write, chmod or touch through the restored name would change the
blob in the store. A blob is linked only if all of these hold (`linkable`): the file is of an immutable
kind (`DiffOptions.immutable_patterns`, RocksDB SSTs by default); the blob file has no write bit
(LocalBlobStore creates blobs 0400, older versions 0444); this process cannot write through it all
the same (`access(W_OK)` with the effective ids: root and CAP_DAC_OVERRIDE can, so as root every
blob is copied); its owner and group are the file's; and its mode is the file's but for bits the
diff does not compare for immutable files (write bits, group and other read bits), so the next
backup sees the same file. A linked file thus has the blob's mode: a 0644 SST becomes 0400. A blob
that grants a bit the file's mode does not (a 0444 blob of an older store for a 0400 SST) is
copied, never linked. This package never chmods or touches a linked file.
"""

from __future__ import annotations

import errno
import mmap
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from ..common import crashpoints
from ..common.nofollow import open_new, open_regular
from ..errors import ChecksumError, StateBackendError
from ..stores import BlobStore
from .checksum import crc_update, format_crc
from .diff import file_metadata
from .index import FileBlob, FileIndex
from .transfer import Progress, download_chunk

if TYPE_CHECKING:
    from .restore import RestoreConfig

#: Permission bits a restore applies from an index: rwx for user, group and others, never setuid,
#: setgid or sticky (an index is data; a hostile one must not hand out privileges).
RESTORED_MODE_MASK = 0o777

_WRITE_BITS = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH


def whole_local_blob(store: BlobStore, f: FileIndex) -> Path | None:
    """The local file of `f`'s blob if `f` is stored as one whole blob in a store that has one."""
    if len(f.blobs) != 1 or f.blobs[0].offset != 0 or f.blobs[0].size != f.metadata.size:
        return None
    return store.local_path(f.blobs[0].blob_id)


def linkable(config: RestoreConfig, name: str, blob_path: Path, st: os.stat_result, f: FileIndex) -> bool:
    """Whether the blob file `blob_path` (stat `st`) may become file `f` by a hard link (module doc):
    an immutable kind of file, a read-only blob this process cannot write through anyway, whose
    owner and group are the file's and whose mode is the file's as the diff compares it, granting
    nothing the file's mode does not."""
    if not (config.link and config.diff.is_immutable(name)):
        return False
    if st.st_mode & _WRITE_BITS:
        return False  # e.g. a blob written before blobs were made read-only
    have, want = file_metadata(st), f.metadata
    if (have.owner, have.group) != (want.owner, want.group):
        return False
    wanted = want.permissions & RESTORED_MODE_MASK
    ignored = config.diff.ignored_bits(name)
    if have.permissions & ~ignored != wanted & ~ignored or have.permissions & ~wanted:
        return False
    # Last, as it is a system call: root (CAP_DAC_OVERRIDE) writes through a read-only mode.
    return not os.access(blob_path, os.W_OK, effective_ids=True)


def place_local(
    store: BlobStore,
    config: RestoreConfig,
    blob_path: Path,
    f: FileIndex,
    target: Path,
    rel: str,
    tmp_dev: int,
    prog: Progress,
) -> bool:
    """[R4] local fast path for one file (module doc); True if it was hard-linked."""
    blob = f.blobs[0]
    try:
        st = os.stat(blob_path)
    except OSError:
        st = None  # missing: the download path raises BlobNotFoundError naming it
    usable = st is not None and stat.S_ISREG(st.st_mode) and st.st_size == blob.size and st.st_dev == tmp_dev
    if st is not None and usable and linkable(config, target.name, blob_path, st, f):
        try:
            os.link(blob_path, target)
        except OSError:  # EMLINK, EPERM (protected_hardlinks), deleted meanwhile: copy instead
            pass
        else:
            # Verify the inode now linked (not the name, which a put could have replaced).
            sync = config.fsync and not store.local_files_durable
            verify_placed(target, rel, blob, sync=sync)
            prog.advance(blob.size)
            crashpoints.crash_point(crashpoints.DURING_RESTORE)  # test-only, as in download_chunk
            return True
    if usable and kernel_copy(blob_path, target, blob.size):
        verify_placed(target, rel, blob, sync=config.fsync)  # what landed in T
        prog.advance(blob.size)
        crashpoints.crash_point(crashpoints.DURING_RESTORE)  # test-only, as in download_chunk
    else:  # the download path: its errors (BlobNotFoundError, ChecksumError) name the blob
        with open_new(target) as out:
            out.truncate(f.metadata.size)
        download_chunk(store, blob, target, rel, prog, sync=config.fsync)
    apply_metadata(target, f)
    return False


def apply_metadata(target: Path, f: FileIndex) -> None:
    """Permissions (within RESTORED_MODE_MASK) and mtime from the index, on a file this restore wrote
    (never on a linked blob)."""
    os.chmod(target, f.metadata.permissions & RESTORED_MODE_MASK)
    os.utime(target, ns=(f.metadata.mtime_ns, f.metadata.mtime_ns))


def verify_placed(target: Path, rel: str, blob: FileBlob, *, sync: bool) -> None:
    """Verify the file now at `target` against `blob` (_verify_fd) and, with `sync`, fdatasync it."""
    fd = os.open(target, os.O_RDONLY)
    try:
        _verify_fd(fd, rel, blob)
        if sync:
            os.fdatasync(fd)
    finally:
        os.close(fd)


def _verify_fd(fd: int, rel: str, blob: FileBlob) -> None:
    """Check that the file open as `fd` holds exactly `blob` (size and CRC32C), reading it through an
    mmap of the page cache (crc32c releases the GIL, so files verify in parallel).

    Raises ChecksumError naming `rel` and the blob, or StateBackendError for a wrong size."""
    size = os.fstat(fd).st_size
    if size != blob.size:
        raise StateBackendError(f"{rel}: blob {blob.blob_id!r} delivered {size} of {blob.size} bytes")
    crc = 0
    if size:
        with (
            mmap.mmap(fd, size, flags=mmap.MAP_SHARED | _MAP_POPULATE, prot=mmap.PROT_READ) as mm,
            memoryview(mm) as view,
        ):
            crc = crc_update(0, view)
    actual = format_crc(crc)
    if actual != blob.checksum:
        raise ChecksumError(rel, blob.blob_id, blob.checksum, actual)


# Fault the whole mapping in at once (Linux) instead of one page fault per 4 KiB while checksumming.
_MAP_POPULATE: int = getattr(mmap, "MAP_POPULATE", 0)


# copy_file_range refusing this pair of files (kernel, filesystem): fall back to a download.
_NO_KERNEL_COPY = frozenset({errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EPERM})


def kernel_copy(src: Path, dst: Path, size: int) -> bool:
    """Copy `size` bytes of `src` into a new `dst` with copy_file_range (a reflink on filesystems that
    share extents, an in-kernel copy elsewhere). False if the kernel refuses the pair (nothing useful
    written, or no copy_file_range on this OS); other errors (ENOSPC, EIO) raise."""
    if not hasattr(os, "copy_file_range"):
        return False
    with open_regular(src) as fin, open_new(dst) as fout:
        done = 0
        while done < size:
            try:
                n = os.copy_file_range(fin.fileno(), fout.fileno(), size - done, done, done)
            except OSError as e:
                if e.errno in _NO_KERNEL_COPY and done == 0:
                    return False
                raise
            if n == 0:
                break  # the source shrank: verification reports the size
            done += n
    return True
