"""What the Azure and S3 blob stores share: options, retries, TTL tags, block uploads, ordered reads.

`CloudBlobStore` (store.py) implements the BlobStore contract once, on top of a handful of primitive
SDK calls (`_raw_*`) that each backend (stores/azure.py, stores/s3.py) supplies. Every primitive is one
request (or one streamed response) and is run by `Calls` (calls.py) under the shared RetryPolicy
(stores/retry.py), so retry, error translation and secret-scrubbing (errors.py) behave the same on
every cloud. Options and URLs: options.py; metadata encoding: metadata.py.

The store is a facade over parts that each get their collaborators explicitly when it is built: `Calls`,
`IoPool` (pool.py: the bounded I/O pool and the buffer limit), `Uploader` (upload.py), `Reader`
(read.py) and `TtlKeeper` (ttl.py), the last three handed the backend's primitives as bound methods.
No part touches another's private members, and no module imports store.py: errors, metadata, options
and pool import none of the others; calls imports errors and options; read and ttl import calls, pool
and options (read also errors); upload imports those and metadata and ttl (`expires_at`); store.py
imports them all.

put(blob, opener, size) (Uploader, upload.py):
  [P1] size <= block_size: one request; every attempt calls `opener()` afresh and reads `size` bytes.
  [P2] larger: begin an upload (S3: a multipart upload; Azure: a random block-id prefix), then read
       the source front to back once, handing each block to the bounded I/O pool, which stages it
       (Azure Put Block / S3 UploadPart). A staged block that must be retried re-opens the input
       (`opener()`, seek to the block) rather than trusting memory shared with the failed attempt.
  [P3] commit the block list with metadata and the TTL tag. Until then readers see the previous
       blob (or none): a failed put never damages what was there. On failure the upload is aborted
       (S3) or left to the service's garbage collection of uncommitted blocks (Azure, 7 days).
get(blob, sink, offset, length) (Reader, read.py):
  [G1] split [offset, end) into `download_chunk_size` ranges; one range is fetched in the caller's
       thread, several go to the pool, at most `max_concurrency` ahead of the one being delivered.
  [G2] each range is a ranged GET retried on its own; a retry resumes after the last byte received.
  [G3] ranges are written to the sink strictly in order, each exactly once, only when complete.
Memory: blocks and ranges held in memory are limited store-wide (IoPool) by a semaphore of
2 * max_concurrency buffers (so at most that many * block/chunk size bytes are buffered).
TTL (TtlKeeper, ttl.py): the expiry time is a tag, `ssb_expires_at_ms`; remove_ttl deletes the tag;
sweep_expired lists the prefix and deletes blobs whose tag is in the past.
"""

from .errors import ErrorInfo, Scrubber
from .metadata import decode_metadata, encode_metadata
from .options import CloudSettings, MiB, parse_settings, split_url
from .store import CloudBlobStore
from .ttl import TTL_TAG, expires_at, expiry_tag_value, parse_expiry

__all__ = [
    "TTL_TAG",
    "CloudBlobStore",
    "CloudSettings",
    "ErrorInfo",
    "MiB",
    "Scrubber",
    "decode_metadata",
    "encode_metadata",
    "expires_at",
    "expiry_tag_value",
    "parse_expiry",
    "parse_settings",
    "split_url",
]
