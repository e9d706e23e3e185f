"""Object storage (s3://, gs://, oci://, ...) through mosaicml-streaming's uploaders and downloaders.

One small interface for what the project writes and reads in a bucket (prepared datasets, checkpoints):
upload a file, download a file, list keys, delete keys. Every scheme streaming supports goes through
the same calls; only s3:// (and S3-compatible stores through `S3_ENDPOINT_URL`) is tested here.

Errors a user can fix (no credentials, a missing bucket, an unreachable endpoint, a missing object)
become one `StorageError` line naming the URL and, for S3, the endpoint.
"""
from __future__ import annotations

import logging
import os
import threading
import urllib.parse
from pathlib import Path
from typing import Callable, Optional, TypeVar

from core.errors import StorageError
from core.streaming_import import require_streaming

T = TypeVar("T")
# Transient failures are retried by botocore and by streaming's uploader; this bounds how long a dead endpoint holds a job.
TIMEOUT_S = 60.0


def is_remote(path: str | os.PathLike | None) -> bool:
    """True for a URL with a scheme (s3://bucket/prefix), False for a local path or None."""
    if path is None:
        return False
    scheme = urllib.parse.urlparse(str(path)).scheme
    return len(scheme) > 1 and scheme != "file"  # one letter: a Windows drive


def join(url: str, *parts: str) -> str:
    """`url/part/...` with one slash between the parts."""
    return "/".join([url.rstrip("/"), *(p.strip("/") for p in parts if p)])


def endpoint(url: str) -> str:
    """Where requests for `url` go, for error messages."""
    if urllib.parse.urlparse(url).scheme == "s3":
        return os.environ.get("S3_ENDPOINT_URL") or "AWS S3 (S3_ENDPOINT_URL not set)"
    return urllib.parse.urlparse(url).scheme


def describe(exc: BaseException, url: str) -> Optional[str]:
    """One line for a storage failure a user can fix, None for anything else (a bug keeps its traceback)."""
    try:
        from botocore import exceptions as bx
    except ImportError:  # pragma: no cover - boto3 comes with the project's dependencies
        bx = None
    where = f"{url} (endpoint {endpoint(url)})"
    try:
        from boto3 import exceptions as b3
    except ImportError:  # pragma: no cover
        b3 = None
    if b3 is not None and isinstance(exc, (b3.S3UploadFailedError, b3.RetriesExceededError)):
        # boto3's transfers wrap the request's own error (AccessDenied, NoSuchBucket, a 5xx after its retries): name
        # that one where it is known.
        cause = getattr(exc, "last_exception", None) or exc.__cause__ or exc.__context__
        return (describe(cause, url) if cause is not None else None) or f"a transfer to or from {where} failed: {exc}"
    if bx is not None:
        if isinstance(exc, bx.NoCredentialsError):
            return (f"no credentials for {where}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, "
                    "or a credentials file")
        if isinstance(exc, (bx.EndpointConnectionError, bx.ConnectTimeoutError, bx.ConnectionClosedError)):
            return f"cannot reach the object store for {where}: {type(exc).__name__}; check S3_ENDPOINT_URL and the network"
        if isinstance(exc, bx.ClientError):
            code = str(exc.response.get("Error", {}).get("Code", ""))
            bucket = urllib.parse.urlparse(url).netloc
            if code in ("NoSuchBucket",):
                return f"bucket '{bucket}' does not exist at {endpoint(url)} (for {url})"
            if code in ("404", "NoSuchKey", "NotFound"):
                return f"not found in the object store: {where} (a missing bucket or object)"
            if code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
                return (f"access denied to {where} ({code}): the credentials (AWS_ACCESS_KEY_ID, AWS_PROFILE) "
                        "lack permission or are wrong")
            return f"the object store refused a request for {where}: {code} {exc}"
        if isinstance(exc, bx.BotoCoreError):
            return f"object store error for {where}: {exc}"
    if isinstance(exc, FileNotFoundError):
        if exc.filename is not None:  # the OS's, about a local file (a staging copy, the cache): not the store's answer
            return None
        return f"not found in the object store: {where}"  # streaming's clients say so of a missing object
    if isinstance(exc, ImportError):
        return f"the client library for {urllib.parse.urlparse(url).scheme}:// is not installed ({exc})"
    if isinstance(exc, ValueError) and str(exc).startswith("Invalid endpoint") and url.startswith("s3://"):
        return (f"S3_ENDPOINT_URL '{os.environ.get('S3_ENDPOINT_URL', '')}' is not an endpoint URL (for {url}): give "
                "http(s)://HOST[:PORT], or unset it for AWS S3")
    if isinstance(exc, ValueError) and ("Unsupported remote path" in str(exc) or "Invalid Cloud provider" in str(exc)):
        return f"unsupported object store URL '{url}': {exc}"
    return None


def guarded(url: str, call: Callable[[], T]) -> T:
    """Run `call`; a storage failure a user can fix becomes a StorageError naming `url`."""
    try:
        return call()
    except StorageError:
        raise
    except Exception as exc:
        line = describe(exc, url)
        if line is None:
            raise
        raise StorageError(line) from exc


class ObjectStore:
    """Files under one remote prefix (`s3://bucket/prefix`): upload, download, list, delete."""

    def __init__(self, url: str) -> None:
        if not is_remote(url):
            raise StorageError(f"'{url}' is not an object store URL (expected scheme://bucket/prefix)")
        self.url = url.rstrip("/")
        self._downloader = None
        # Made once and kept: each new client reads botocore's service models again, some 0.2 s of the interpreter
        # a client, which a checkpoint upload in the background takes from the training loop beside it (BENCHMARKS.md,
        # "What a background upload costs the loop beside it"). A client is thread-safe, and each is made from a
        # session of its own, so threads may make them at once; the lock only keeps the first one made.
        self._uploader = None
        self._lister = None
        self._deleter = None
        self._keeping = threading.Lock()

    def _kept(self, name: str, make: Callable[[], T], usable: Callable[[T], bool] = lambda client: True) -> T:
        """The client kept as `name`, made first when there is none (or none `usable`). It is made outside the lock:
        making an uploader asks the bucket (up to botocore's retries against a dead endpoint), and a thread that needs
        another client already made, at a preemption's save, must not wait for that."""
        client = getattr(self, name)
        if client is not None and usable(client):
            return client
        made = make()
        with self._keeping:
            client = getattr(self, name)
            if client is None or not usable(client):
                setattr(self, name, made)
                client = made
        return client

    def _up(self, staging: Path):
        """Streaming's uploader for this prefix, uploading from `staging`; its constructor checks the bucket exists."""
        return self._kept("_uploader", lambda: self._new_uploader(staging), lambda up: Path(up.local) == staging)

    def _new_uploader(self, staging: Path):
        """A new streaming uploader from `staging` to this prefix (a new client)."""
        require_streaming()
        from streaming.base.storage import CloudUploader

        # It warns that the staging folder is not empty, which is the point of uploading from it.
        logging.getLogger("streaming.base.storage.upload").setLevel(logging.ERROR)
        return guarded(self.url, lambda: CloudUploader.get((str(staging), self.url), keep_local=True, exist_ok=True,
                                                            retry=2))

    def check(self) -> None:
        """Fail with one line when the bucket is missing, the endpoint unreachable or the credentials absent."""
        try:
            checked = self._new_lister()
        except StorageError as exc:
            code = getattr(exc.__cause__, "response", {}).get("Error", {}).get("Code")
            if code in ("404", "NoSuchBucket"):  # HeadBucket answers a bare 404
                bucket = urllib.parse.urlparse(self.url).netloc
                raise StorageError(f"bucket '{bucket}' does not exist at {endpoint(self.url)} (for {self.url}); "
                                   "create it, or check the name and S3_ENDPOINT_URL") from exc.__cause__
            raise
        self._kept("_lister", lambda: checked)

    def _new_lister(self):
        """A new uploader that serves for listing: it reads no staging folder, so it keeps working once this one's
        (an empty temporary folder) is gone."""
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            return self._new_uploader(Path(tmp))

    def upload(self, local_root: Path, relative: str) -> None:
        """Upload `local_root/relative` to `url/relative`."""
        up = self._up(Path(local_root))
        guarded(join(self.url, relative), lambda: up.upload_file(relative))

    def list(self, prefix: str = "") -> list[str]:
        """Keys under `url/prefix`, relative to `url`."""
        lister = self._kept("_lister", self._new_lister)
        keys = guarded(join(self.url, prefix), lambda: lister.list_objects(prefix) or [])
        base = urllib.parse.urlparse(self.url).path.strip("/")
        return sorted(k[len(base):].lstrip("/") if base and k.startswith(base) else k for k in keys)

    def download(self, relative: str, local: Path, overwrite: bool = True) -> Path:
        """Download `url/relative` to `local` (through a temporary name, so no half file stays behind); a key with a
        '..', '.' or empty part is refused: joined to the folder it goes to, it could name a file outside it."""
        if any(part in ("", ".", "..") for part in relative.split("/")):  # '//' makes the rest an absolute path
            raise StorageError(f"'{join(self.url, relative)}': a key that climbs out of its prefix (a '..' part, or an "
                               "empty one: '//', a leading '/') would be written outside the folder it is downloaded "
                               "to; refused (who wrote it?)")
        require_streaming()
        from streaming.base.storage import CloudDownloader

        local = Path(local)
        if local.exists() and not overwrite:
            return local
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = local.with_name(f".{local.name}.download-{os.getpid()}")
        tmp.unlink(missing_ok=True)
        remote = join(self.url, relative)
        if self._downloader is None:
            self._downloader = guarded(remote, lambda: CloudDownloader.get(remote))
        try:
            guarded(remote, lambda: self._downloader.download(remote, str(tmp), TIMEOUT_S))
            os.replace(tmp, local)
        finally:
            tmp.unlink(missing_ok=True)
        return local

    def delete(self, keys: list[str]) -> bool:
        """Delete `keys` (relative to `url`); False where the scheme has no delete here (only s3:// does)."""
        parsed = urllib.parse.urlparse(self.url)
        if parsed.scheme != "s3" or not keys:
            return parsed.scheme == "s3"
        import boto3

        client = self._kept("_deleter", lambda: guarded(self.url, lambda: boto3.session.Session().client(
            "s3", endpoint_url=os.environ.get("S3_ENDPOINT_URL"))))
        base = parsed.path.strip("/")
        objects = [{"Key": f"{base}/{k}" if base else k} for k in keys]
        for i in range(0, len(objects), 1000):
            answer = guarded(self.url, lambda: client.delete_objects(Bucket=parsed.netloc,
                                                                     Delete={"Objects": objects[i:i + 1000]}))
            check_deleted(answer, parsed.netloc)
        return True


def check_deleted(answer: dict, bucket: str) -> None:
    """Refuse a DeleteObjects answer that lists keys it did not delete: S3 answers 200 for the request whatever
    befell each key (a policy that denies deletes, a retention lock), and a marker taken for deleted would leave a
    checkpoint the resume takes, or a manifest over replaced shards."""
    errors = answer.get("Errors") or []
    if errors:
        first = errors[0]
        raise StorageError(f"s3://{bucket}/{first.get('Key')} was not deleted ({first.get('Code')}: "
                           f"{first.get('Message')})" + (f", nor {len(errors) - 1} other object(s)" if len(errors) > 1
                                                           else "") + "; give the credentials delete rights there, or "
                           "lift the bucket's retention")
