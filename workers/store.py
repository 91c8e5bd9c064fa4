"""Where a run's outputs go: its run folder, or a folder in an object store (``--results
s3://bucket/prefix``, or any URL fsspec opens, see inputs/object_store.py).

For a store, the run's own folder (``run_dir``) is a private local one: the collector appends to
its journal and lists and cuts them back, which objects cannot do. Annotated images, labels and
crops go to the store as they are made, videos when they are closed, and the local folder's files
at the end of the run (supervisor/stored_runs.py), all under ``RESULTS/<run name>/``.

Credentials and the endpoint come the store's usual way (for S3: the environment, ``~/.aws``),
never from a flag, so no error, log line or report made from these URLs holds one.
"""

from __future__ import annotations

import errno
import os
import posixpath

from inputs.object_store import is_store_url, store_of

DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)  # a folder's refusals that stop saving


def run_root(results: str, run_dir: str) -> str:
    """The outputs' root of the run whose own folder is ``run_dir``: ``run_dir`` itself, or
    ``RESULTS/<its name>`` when ``results`` is a store's URL."""
    if not is_store_url(results):
        return run_dir
    return join(results, os.path.basename(os.path.normpath(run_dir)))


def join(root: str, relative: str) -> str:
    """``root/relative``, with ``/`` for a URL; ``relative`` always uses ``/``."""
    if is_store_url(root):
        return posixpath.join(root.rstrip("/"), relative)
    return os.path.join(root, *relative.split("/"))


def store_errors() -> tuple[type[BaseException], ...]:
    """What a store raises when it refuses or cannot be reached: OSError (fsspec turns most
    answers into one: PermissionError for 403, FileNotFoundError for a missing bucket), and
    botocore's own (NoCredentialsError, EndpointConnectionError, ClientError) where installed."""
    errors: list[type[BaseException]] = [OSError]
    try:
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:
        return tuple(errors)
    return (*errors, BotoCoreError, ClientError)


def why(exc: BaseException) -> str:
    """A store's refusal in words: the exception's class and message."""
    text = str(exc)
    return f"{exc.__class__.__name__}: {text}" if text else exc.__class__.__name__


class Store:
    """One output root opened once: a folder, or a URL with its fsspec file system."""

    def __init__(self, root: str):
        self.root = root
        self.is_url = is_store_url(root)
        self.fs, self.path = store_of(root) if self.is_url else (None, root)

    def where(self, relative: str) -> str:
        """The place ``relative`` goes, as said in errors: a path or a URL."""
        return join(self.root, relative)

    def write(self, relative: str, data) -> None:
        """``data`` (bytes-like) as ``root/relative``, whole: a URL's object is PUT in one request
        (no folders to make); a folder's file is written as it is, its folders made."""
        if self.is_url:
            self.fs.pipe_file(self._key(relative), bytes(data))
            return
        path = self.where(relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)

    def put(self, local: str, relative: str) -> None:
        """Copy the local file ``local`` to ``root/relative``. This and the methods below: a URL only."""
        self.fs.put_file(local, self._key(relative))

    def below(self, relative: str) -> list[str]:
        """The objects below ``root/relative``, named relative to it."""
        key = self._key(relative)
        return [found[len(key):].lstrip("/") for found in self.fs.find(key)]

    def read(self, relative: str) -> bytes:
        return self.fs.cat_file(self._key(relative))

    def move(self, relative: str, to: str) -> None:
        """``root/relative`` becomes ``root/to`` (a store copies it and deletes the first)."""
        self.fs.mv(self._key(relative), self._key(to))

    def exists(self, relative: str) -> bool:
        return self.fs.exists(self._key(relative))

    def remove(self, relative: str) -> None:
        """``root/relative``, an object or everything below it."""
        self.fs.rm(self._key(relative), recursive=True)

    def _key(self, relative: str) -> str:
        return posixpath.join(self.path.rstrip("/"), relative)
