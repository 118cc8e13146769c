"""Amazon S3 (and S3-compatible servers) backend with boto3: `s3://<bucket>/<prefix>`.

Objects are named `<prefix><blob id>` in `<bucket>`. Small blobs are one PutObject; larger ones a
multipart upload whose parts go up in parallel and which is completed (or aborted on failure) at the
end, so readers keep seeing the previous object until then (see stores/cloud/ for the shared algorithms).
Reads are parallel ranged GETs delivered in order. The exclusive `create` is `PutObject` with
`If-None-Match: *`. The TTL is the object tag `ssb_expires_at_ms`; S3 cannot make a delete
conditional on a tag, so the sweep re-reads the tag just before deleting. A TTL removed in the
milliseconds between those two requests can still lose the race, so a caller sweeping while
commits run should pass a `now_ms` some minutes behind the clock.

Endpoint: option `endpoint_url`, else env AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, else AWS.
Region: option `region`, else AWS_REGION / AWS_DEFAULT_REGION / the profile, else us-east-1.
Credentials: options `access_key_id` + `secret_access_key` (+ `session_token`), or option
`profile`, else boto3's standard chain (env, shared files, SSO, container and instance roles).

Options (all strings; durations and sizes in Spark's grammar, see common/units.py):
    endpoint_url, region, addressing_style (auto|path|virtual; path when endpoint_url is set),
    access_key_id, secret_access_key, session_token, profile,
    retry_budget (120s), retry_initial_backoff (200ms), retry_max_backoff (10s),
    connect_timeout (10s), read_timeout (60s), max_concurrency (8),
    block_size (8m, at least 5m: the multipart part size), download_chunk_size (8m).
    Deprecated spellings, one more release: retry_budget_seconds, retry_initial_backoff_seconds,
    retry_max_backoff_seconds, connect_timeout_seconds, read_timeout_seconds (a bare number of seconds).

botocore's own retries are off (one attempt): the shared RetryPolicy is the only one.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

import boto3
import botocore.exceptions as bx
from botocore.config import Config

from ..errors import ConfigError
from .cloud import (
    TTL_TAG,
    CloudBlobStore,
    CloudSettings,
    ErrorInfo,
    MiB,
    Scrubber,
    expiry_tag_value,
    parse_settings,
    split_url,
)
from .s3_errors import classify, code_of, status_of

_BACKEND_OPTIONS = (
    "endpoint_url",
    "region",
    "addressing_style",
    "access_key_id",
    "secret_access_key",
    "session_token",
    "profile",
)
_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_MIN_PART = 5 * MiB
_MAX_PARTS = 10_000
_READ_PIECE = 1 * MiB


def _ms(dt: datetime | None) -> int:
    return int(dt.timestamp() * 1000) if dt else 0


def _tagging(expires_ms: int | None) -> dict[str, str]:
    return (
        {}
        if expires_ms is None
        else {"Tagging": urllib.parse.urlencode({TTL_TAG: expiry_tag_value(expires_ms)})}
    )


def _multipart_etag(part_etags: Sequence[str]) -> str:
    """The ETag S3 gives a completed multipart object: md5 of the parts' md5s, dash, part count."""
    digest = hashlib.md5(b"".join(bytes.fromhex(e.strip('"')) for e in part_etags), usedforsecurity=False)
    return f'"{digest.hexdigest()}-{len(part_etags)}"'


class S3BlobStore(CloudBlobStore[dict[str, Any]]):
    """BlobStore on an S3 bucket (AWS, SeaweedFS, moto, MinIO...); see the module docstring."""

    scheme = "s3"
    _root_word = "bucket"
    delete_batch_size = 1000  # DeleteObjects' limit

    def __init__(
        self,
        client: Any,
        bucket: str,
        prefix: str,
        settings: CloudSettings,
        scrub: Scrubber,
        endpoint: str,
        region: str,
    ) -> None:
        super().__init__(root=bucket, prefix=prefix, settings=settings, scrub=scrub, endpoint=endpoint)
        self._s3 = client
        self.region = region

    @classmethod
    def from_url(
        cls, url: str, options: Mapping[str, str] | None = None, *, key: str = "blob URL"
    ) -> S3BlobStore:
        """Build the store from `s3://<bucket>/<prefix>` and options; contacts nothing."""
        opts = dict(options or {})
        bucket, prefix = split_url(url, "s3", key, "bucket")
        if not _BUCKET_NAME.match(bucket) or ".." in bucket:
            raise ConfigError(
                key, f"{bucket!r} is not a valid S3 bucket name (3-63 of a-z, 0-9, '.' and '-')"
            )
        settings = parse_settings(opts, key, _BACKEND_OPTIONS, min_block_size=_MIN_PART)
        endpoint = (
            opts.get("endpoint_url")
            or os.environ.get("AWS_ENDPOINT_URL_S3")
            or os.environ.get("AWS_ENDPOINT_URL")
        )
        if endpoint:
            parsed = urllib.parse.urlsplit(endpoint)
            if parsed.scheme not in ("http", "https") or not parsed.netloc or parsed.query:
                raise ConfigError(
                    f"{key} option endpoint_url", f"{endpoint!r} is not an http(s) URL without a query"
                )
        style = opts.get("addressing_style") or ("path" if endpoint else "auto")
        if style not in ("auto", "path", "virtual"):
            raise ConfigError(
                f"{key} option addressing_style", f"must be auto, path or virtual, got {style!r}"
            )
        access, secret = opts.get("access_key_id"), opts.get("secret_access_key")
        if bool(access) != bool(secret):
            raise ConfigError(f"{key} options", "access_key_id and secret_access_key go together")
        try:
            session = boto3.session.Session(
                aws_access_key_id=access,
                aws_secret_access_key=secret,
                aws_session_token=opts.get("session_token"),
                profile_name=opts.get("profile"),
            )
        except bx.ProfileNotFound:
            raise ConfigError(
                f"{key} option profile", f"AWS profile {opts.get('profile')!r} not found"
            ) from None
        region = opts.get("region") or session.region_name or "us-east-1"
        config = Config(
            region_name=region,
            connect_timeout=settings.connect_timeout_seconds,
            read_timeout=settings.read_timeout_seconds,
            retries={"mode": "standard", "total_max_attempts": 1},
            max_pool_connections=settings.max_concurrency + 4,
            s3={"addressing_style": style},
            user_agent_extra="spark-statebackend",
        )
        try:
            client = session.client("s3", endpoint_url=endpoint or None, config=config)
        except ValueError as e:
            raise ConfigError(f"{key} option endpoint_url", f"rejected by botocore: {e}") from None
        secrets: list[str | None] = [secret, opts.get("session_token")]
        try:
            creds = session.get_credentials()
        except bx.BotoCoreError:
            creds = None  # reported clearly by the first request (ensure_ready)
        if creds is not None:
            secrets += [creds.secret_key, creds.token]
        return cls(
            client, bucket, prefix, settings, Scrubber(secrets), endpoint or client.meta.endpoint_url, region
        )

    # ---- start

    def ensure_ready(self) -> None:
        """Create the bucket if missing, then list under the prefix to prove read access."""

        def check() -> None:
            try:
                self._s3.head_bucket(Bucket=self.root)
                return
            except bx.ClientError as e:
                if status_of(e) != 404:
                    raise
            args: dict[str, Any] = {"Bucket": self.root}
            if self.region != "us-east-1":
                args["CreateBucketConfiguration"] = {"LocationConstraint": self.region}
            try:
                self._s3.create_bucket(**args)
            except bx.ClientError as e:
                if code_of(e) != "BucketAlreadyOwnedByYou":
                    raise

        self._call(check, f"check bucket {self.root!r}")
        self._call(lambda: self._raw_list_page(self.prefix, None, 1), f"list bucket {self.root!r}")

    def close(self) -> None:
        super().close()
        self._s3.close()

    # ---- errors

    def _classify(self, exc: BaseException) -> ErrorInfo:
        return classify(exc, self._scrub)

    # ---- primitives

    def _raw_put(self, name: str, data: bytes, metadata: dict[str, str], expires_ms: int | None) -> None:
        self._s3.put_object(Bucket=self.root, Key=name, Body=data, Metadata=metadata, **_tagging(expires_ms))

    def _raw_create(self, name: str, data: bytes, metadata: dict[str, str]) -> None:
        self._s3.put_object(Bucket=self.root, Key=name, Body=data, Metadata=metadata, IfNoneMatch="*")

    def _block_size_for(self, size: int) -> int:
        return max(self.settings.block_size, math.ceil(size / _MAX_PARTS))

    def _raw_begin_blocks(self, name: str, metadata: dict[str, str], expires_ms: int | None) -> str:
        resp = self._s3.create_multipart_upload(
            Bucket=self.root, Key=name, Metadata=metadata, **_tagging(expires_ms)
        )
        return str(resp["UploadId"])

    def _raw_stage_block(self, name: str, upload: str, index: int, data: bytes) -> dict[str, Any]:
        resp = self._s3.upload_part(
            Bucket=self.root, Key=name, UploadId=upload, PartNumber=index + 1, Body=data
        )
        return {"PartNumber": index + 1, "ETag": resp["ETag"]}

    def _raw_commit_blocks(
        self,
        name: str,
        upload: str,
        staged: Sequence[dict[str, Any]],
        metadata: dict[str, str],
        expires_ms: int | None,
    ) -> None:
        try:
            self._s3.complete_multipart_upload(
                Bucket=self.root, Key=name, UploadId=upload, MultipartUpload={"Parts": list(staged)}
            )
        except bx.ClientError as e:
            # A retry after a completion whose answer was lost finds the upload gone: if the object
            # now has exactly this upload's ETag, the completion did happen.
            if code_of(e) != "NoSuchUpload":
                raise
            try:
                head = self._s3.head_object(Bucket=self.root, Key=name)
            except bx.ClientError:
                raise e from None
            if head.get("ETag") != _multipart_etag([p["ETag"] for p in staged]):
                raise

    def _raw_abort_blocks(self, name: str, upload: str) -> None:
        try:
            self._s3.abort_multipart_upload(Bucket=self.root, Key=name, UploadId=upload)
        except bx.ClientError as e:
            if code_of(e) != "NoSuchUpload":
                raise

    def _raw_open_range(self, name: str, start: int, end: int) -> tuple[int, Iterator[bytes]]:
        resp = self._s3.get_object(Bucket=self.root, Key=name, Range=f"bytes={start}-{end - 1}")
        content_range = resp.get("ContentRange")
        total = int(content_range.rsplit("/", 1)[1]) if content_range else int(resp["ContentLength"])
        body = resp["Body"]

        def pieces() -> Iterator[bytes]:
            try:
                yield from body.iter_chunks(_READ_PIECE)
            finally:
                body.close()

        return total, pieces()

    def _raw_delete(self, name: str) -> None:
        try:
            self._s3.delete_object(Bucket=self.root, Key=name)
        except bx.ClientError as e:
            if status_of(e) != 404 or code_of(e) == "NoSuchBucket":
                raise

    def _raw_delete_batch(self, names: Sequence[str]) -> list[str]:
        # Quiet: the answer lists only the keys it failed; a missing key is deleted by S3's rules.
        resp = self._s3.delete_objects(
            Bucket=self.root, Delete={"Objects": [{"Key": n} for n in names], "Quiet": True}
        )
        return [e["Key"] for e in resp.get("Errors", []) if e.get("Code") != "NoSuchKey"]

    def _raw_delete_if_expired(self, name: str, tag_value: str) -> bool:
        try:
            if self._raw_get_tags(name).get(TTL_TAG) != tag_value:
                return False
        except bx.ClientError as e:
            if self._classify(e).kind == "not_found":
                return False
            raise
        self._raw_delete(name)
        return True

    def _raw_get_tags(self, name: str) -> dict[str, str]:
        resp = self._s3.get_object_tagging(Bucket=self.root, Key=name)
        return {t["Key"]: t["Value"] for t in resp.get("TagSet", [])}

    def _raw_set_tags(self, name: str, tags: dict[str, str]) -> None:
        if tags:
            tag_set = [{"Key": k, "Value": v} for k, v in tags.items()]
            self._s3.put_object_tagging(Bucket=self.root, Key=name, Tagging={"TagSet": tag_set})
        else:
            self._s3.delete_object_tagging(Bucket=self.root, Key=name)

    def _raw_stat(self, name: str) -> tuple[int, int, dict[str, str], dict[str, str] | None]:
        head = self._s3.head_object(Bucket=self.root, Key=name)
        return (
            int(head["ContentLength"]),
            _ms(head.get("LastModified")),
            dict(head.get("Metadata") or {}),
            None,
        )

    def _raw_list_page(
        self, name_prefix: str, token: str | None, page_size: int = 1000
    ) -> tuple[list[tuple[str, int, int, dict[str, str] | None]], str | None]:
        args: dict[str, Any] = {"Bucket": self.root, "Prefix": name_prefix, "MaxKeys": page_size}
        if token:
            args["ContinuationToken"] = token
        resp = self._s3.list_objects_v2(**args)
        items: list[tuple[str, int, int, dict[str, str] | None]] = [
            (str(o["Key"]), int(o["Size"]), _ms(o.get("LastModified")), None)
            for o in resp.get("Contents", [])
        ]
        following = resp.get("NextContinuationToken") if resp.get("IsTruncated") else None
        return items, (str(following) if following else None)
