"""Sources in object storage or on any file system fsspec reaches: ``s3://bucket/prefix``,
``gs://bucket/prefix`` (with gcsfs installed), ``az://...``; the input kind ``"stored"``.

A source URL names one object or a prefix. A prefix is listed recursively, as a folder is:
its images (:data:`inputs.frames.IMAGE_EXTENSIONS`) become items named by their key below the
prefix (``s3://b/imgs`` holding ``imgs/sub/a.jpg`` -> ``sub/a.jpg``), in name order; hidden
keys (a part starting with ``.``) and files that are not media are left out. Videos are refused
(ValueError naming them): reading one as it streams needs seeking through the store; copy them
to a path every node mounts. Each image's bytes are read through fsspec when its frame is read,
on whichever machine reads it (a cluster node reads its own frames from the store).

Credentials and the endpoint come the usual way for the store, never from the command line:
for S3 the environment (``AWS_ACCESS_KEY_ID``, ``AWS_PROFILE``, ``AWS_ENDPOINT_URL`` for an
S3-compatible server), ``~/.aws/config``, or fsspec's own configuration (``FSSPEC_S3_*``,
``~/.config/fsspec``). The items' locations are the URLs as given, so a name or a log line
never holds a secret unless the source itself did.

``fsspec`` and ``s3fs`` are imported only for such a source (requirements.txt).
"""

from __future__ import annotations

import posixpath

import numpy as np

from inputs.frames import Frame, FrameReadError, FrameRef, SourceItem
from inputs.imageio import decode_image, image_size, read_encoded
from inputs.frames import IMAGE_EXTENSIONS, VIDEO_EXTENSIONS
from inputs.streams import URL_SCHEMES

KIND = "stored"
STORE_SCHEMES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "hdfs", "webhdfs", "sftp", "ftp",
                           "oss", "oci"})  # said even without fsspec, so that the error names it
NOT_STORES = URL_SCHEMES | {"file", "local"}  # OpenCV's URLs and plain paths are read as today
PROBED_OBJECTS = 16  # image headers fetched (in one concurrent call) to size the frame slots
HEADER_BYTES = 1 << 16


def is_store_url(source: str) -> bool:
    """``scheme://...`` for a file system fsspec knows (or a common store's scheme)."""
    scheme, sep, _ = source.partition("://")
    scheme = scheme.lower()
    if not sep or not scheme or scheme in NOT_STORES:
        return False
    if scheme in STORE_SCHEMES:
        return True
    try:
        from fsspec.registry import known_implementations
    except ImportError:
        return False
    return scheme in known_implementations


def store_of(url: str):
    """``(file system, path)`` of ``url``; ValueError saying what to install or what is wrong."""
    try:
        import fsspec
    except ImportError:
        raise ValueError(f"expected fsspec installed to read {_scheme(url)}:// sources, got none: pip install -r "
                         "requirements.txt (fsspec, s3fs)") from None
    try:
        return fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as exc:  # fsspec says which package a scheme needs
        raise ValueError(f"cannot open {_scheme(url)}:// sources: {exc}") from None


def _scheme(url: str) -> str:
    return url.partition("://")[0].lower()


def plan_store(source: str, planning) -> list[SourceItem]:
    """The items of an object or a prefix (see the module docstring)."""
    fs, root = store_of(source)
    scheme = _scheme(source)
    try:
        if fs.isfile(root):
            keys, base = [root], posixpath.dirname(root)
        else:
            keys, base = sorted(fs.find(root, detail=False)), root.rstrip("/")
    except Exception as exc:  # botocore, aiohttp and fsspec errors alike: the store said no
        raise ValueError(f"expected a readable object or prefix, got {source!r}: {_said(exc)}") from None
    names = [(key, posixpath.relpath(key, base)) for key in keys]
    names = [(key, name) for key, name in names if not any(part.startswith(".") for part in name.split("/"))]
    videos = [name for _key, name in names if posixpath.splitext(name)[1].lower() in VIDEO_EXTENSIONS]
    if videos:
        raise ValueError(f"expected images only under {source!r}, got {len(videos)} videos ({', '.join(videos[:3])}"
                         f"{', ...' if len(videos) > 3 else ''}): videos are not read from object storage; copy them "
                         "to a path every node mounts")
    items = [SourceItem(KIND, f"{scheme}://{key}", name, 1) for key, name in names
             if posixpath.splitext(name)[1].lower() in IMAGE_EXTENSIONS]
    if not items:
        raise ValueError(f"expected {source!r} to hold images ({', '.join(sorted(IMAGE_EXTENSIONS))}), got none")
    return items


def _stored_bytes(ref: FrameRef) -> np.ndarray:
    try:
        fs, path = store_of(ref.location)
        return np.frombuffer(fs.cat_file(path), np.uint8)
    except Exception as exc:  # any error of the store is this frame's: the run goes on
        raise FrameReadError(f"cannot read {ref.location}: {_said(exc)}") from None


def read_stored(ref: FrameRef, reader) -> Frame:
    """An image's bytes from the store, decoded within the reader's limits."""
    image, original_shape, reduction = decode_image(_stored_bytes(ref), reader.decode, ref.location)
    return Frame(ref, image, original_shape, reduction)


def read_stored_encoded(ref: FrameRef, reader) -> Frame:
    """An image's bytes from the store, left for the device to decode."""
    data, shape = read_encoded(_stored_bytes(ref), reader.decode, ref.location)
    return Frame(ref, None, shape, encoded=data)


def stored_sizes(items: list[SourceItem]) -> list[tuple[int, int]]:
    """``(H, W)`` from the headers of the first PROBED_OBJECTS images, fetched together;
    unreadable ones are left out (they fail when read)."""
    probed = items[:PROBED_OBJECTS]
    if not probed:
        return []
    try:
        fs, _ = store_of(probed[0].location)
        paths = [store_of(item.location)[1] for item in probed]
        heads = fs.cat_ranges(paths, [0] * len(paths), [HEADER_BYTES] * len(paths), on_error="return")
    except Exception:  # the slots are then sized from the model's input size
        return []
    sizes = [image_size(head) for head in heads if isinstance(head, bytes)]
    return [(size[1], size[0]) for size in sizes if size]


def unreachable(location: str) -> str | None:
    """Why ``location`` (an object's URL) cannot be read from this machine, or None."""
    try:
        fs, path = store_of(location)
        fs.info(path)
    except Exception as exc:
        return _said(exc)
    return None


def _said(exc: Exception) -> str:
    """An error of the store in one line: its type and first line (no traceback, no request)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__

