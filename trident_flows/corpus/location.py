"""A place documents land or a table lives: a local directory or any filesystem URL.

Contract:
- ``open_location(uri, credentials=None)``: a local path, ``file://`` URL, or any filesystem URL
  pyarrow or fsspec opens. Credentials come from that filesystem's standard places or, for
  ``s3://``, from ``S3Credentials`` (refused for another scheme). A URL is probed once: an unknown
  scheme, refused credentials or an unreachable location raise ``LocationError`` in one line
  (URI, where the credentials came from, what to change); opening creates nothing.
- ``Location.storage_options``: the same credentials for ``deltalake``.
- ``Location.list_files(suffix)``: every file under the root ending in ``suffix`` (case-insensitive),
  recursively, as an Arrow table ``path`` (relative, sorted), ``size``, ``mtime_ns``.
- ``read_bytes``, ``write_bytes`` (whole-object: a reader never sees half a file), ``exists`` and
  ``uri_of``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.fs as pafs

STANDARD_HINT = ("check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or ~/.aws/credentials, an instance role) and AWS_ENDPOINT_URL for "
                 "an S3-compatible server (or, for a document-curation flow, name a Trident S3 Credentials block)")


class LocationError(ValueError):
    """A location that cannot be opened or read; the message names it and what to change."""


@dataclass(frozen=True)
class S3Credentials:
    """Credentials for ``s3://`` locations given explicitly; ``source`` says where they came from (for errors)."""

    access_key_id: str
    secret_access_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)
    endpoint_url: str | None = None
    region: str | None = None
    source: str = "the S3Credentials given"

    def filesystem(self) -> pafs.S3FileSystem:
        endpoint = urlsplit(self.endpoint_url) if self.endpoint_url else None
        return pafs.S3FileSystem(access_key=self.access_key_id, secret_key=self.secret_access_key, session_token=self.session_token,
                                 region=self.region, scheme=endpoint.scheme if endpoint else None,
                                 endpoint_override=endpoint.netloc if endpoint else None)

    def storage_options(self) -> dict[str, str]:
        """Delta Lake's options for these credentials."""
        options = {"AWS_ACCESS_KEY_ID": self.access_key_id, "AWS_SECRET_ACCESS_KEY": self.secret_access_key}
        if self.session_token:
            options["AWS_SESSION_TOKEN"] = self.session_token
        if self.endpoint_url:
            options["AWS_ENDPOINT_URL"] = self.endpoint_url
            options["AWS_ALLOW_HTTP"] = str(self.endpoint_url.startswith("http://")).lower()
        if self.region:
            options["AWS_REGION"] = self.region
        return options

    def hint(self) -> str:
        return f"check the access key id, secret access key and endpoint of {self.source}"


def _is_url(uri: str) -> bool:
    return "://" in uri and not uri.startswith("file://")


@dataclass(frozen=True)
class Location:
    """A filesystem and a root directory on it (see the module docstring)."""

    uri: str
    fs: pafs.FileSystem
    root: str
    storage_options: Mapping[str, str] = field(default_factory=dict)

    def _full(self, rel: str) -> str:
        return f"{self.root.rstrip('/')}/{rel}" if rel else self.root

    def uri_of(self, rel: str) -> str:
        """The URL (or local path) of ``rel`` under the root."""
        return f"{self.uri.rstrip('/')}/{rel}" if rel else self.uri

    def list_files(self, suffix: str) -> pa.Table:
        """Every file under the root ending with ``suffix``: ``path`` (relative), ``size``, ``mtime_ns``."""
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self.root, recursive=True, allow_not_found=False))
        except FileNotFoundError:
            raise LocationError(f"input {self.uri}: no such directory or bucket prefix; give the directory (or URL) where the "
                                "documents land") from None
        except OSError as exc:
            raise LocationError(f"input {self.uri}: cannot list it ({_one_line(exc)}); check the URL and the credentials "
                                "(for S3: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or ~/.aws, AWS_ENDPOINT_URL for an S3-compatible server)") from None
        prefix = self.root.rstrip("/") + "/"
        wanted = suffix.lower()
        files = sorted((i.path[len(prefix):] if i.path.startswith(prefix) else i.path, i.size, i.mtime_ns or 0)
                       for i in infos if i.type == pafs.FileType.File and i.path.lower().endswith(wanted))
        return pa.table({"path": pa.array([f[0] for f in files], pa.string()), "size": pa.array([f[1] for f in files], pa.int64()),
                         "mtime_ns": pa.array([f[2] for f in files], pa.int64())})

    def read_bytes(self, rel: str) -> bytes:
        with self.fs.open_input_stream(self._full(rel)) as stream:
            return stream.read()

    def exists(self, rel: str) -> bool:
        return self.fs.get_file_info(self._full(rel)).type == pafs.FileType.File

    def write_bytes(self, rel: str, data: bytes) -> None:
        """Write ``rel`` whole (see the module docstring)."""
        full = self._full(rel)
        self.fs.create_dir(full.rpartition("/")[0], recursive=True)
        if isinstance(self.fs, pafs.LocalFileSystem):
            tmp = f"{full.rpartition('/')[0]}/.{full.rpartition('/')[2]}.{uuid.uuid4().hex}.tmp"
            with self.fs.open_output_stream(tmp) as stream:
                stream.write(data)
            self.fs.move(tmp, full)
            return
        with self.fs.open_output_stream(full) as stream:
            stream.write(data)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def open_location(uri: str | Path, credentials: S3Credentials | None = None) -> Location:
    """Open ``uri`` (see the module docstring)."""
    text = str(uri).strip()
    if not text:
        raise LocationError("empty location: give a directory or a filesystem URL such as s3://bucket/prefix")
    if credentials is not None and not text.startswith("s3://"):
        raise LocationError(f"{text}: {credentials.source} is for s3:// locations; give an s3:// URL, or no credentials for this location")
    if not _is_url(text):
        path = Path(text.removeprefix("file://")).expanduser().resolve()
        return Location(str(path), pafs.LocalFileSystem(), str(path))
    location = _open_url(text, credentials)
    try:
        location.fs.get_file_info(location.root)
    except OSError as exc:
        used, hint = ((f"the credentials of {credentials.source}", credentials.hint()) if credentials is not None else
                      ("the credentials from the standard places", STANDARD_HINT if text.startswith("s3://") else
                       "check the credentials of this filesystem"))
        raise LocationError(f"{text}: cannot reach it with {used} ({_one_line(exc)}); {hint}") from None
    return location


def _open_url(text: str, credentials: S3Credentials | None) -> Location:
    if credentials is not None:
        return Location(text.rstrip("/"), credentials.filesystem(), text.removeprefix("s3://").rstrip("/"), credentials.storage_options())
    try:
        fs, root = pafs.FileSystem.from_uri(text)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        try:
            import fsspec
            from pyarrow.fs import FSSpecHandler, PyFileSystem

            spec_fs, root = fsspec.core.url_to_fs(text)
        except (ImportError, ValueError) as exc:
            raise LocationError(f"{text}: no filesystem for this URL scheme ({exc}); give a local directory, an s3:// or gs:// URL, "
                                "or install the fsspec implementation of that scheme") from None
        fs = PyFileSystem(FSSpecHandler(spec_fs))
    except OSError as exc:
        raise LocationError(f"{text}: cannot open it ({_one_line(exc)}); check the URL and the credentials") from None
    return Location(text.rstrip("/"), fs, root.rstrip("/"))
