"""What frames a run reads: the items of a source.

Sources (:func:`plan_frames`):

- ``"synthetic"``: ``synthetic_count`` generated scenes (:mod:`inputs.synthetic`).
- an image file (:data:`inputs.frames.IMAGE_EXTENSIONS`) or a video file
  (:data:`inputs.kinds.VIDEO_EXTENSIONS`), or a file of another input kind's extensions.
- a directory, searched recursively, following directory symlinks (a directory reached twice,
  e.g. through a symlink loop, is listed once). Images are images and videos are read frame by
  frame. Files whose extension is neither an image's nor a video's (a YOLO dataset's
  ``labels/*.txt`` and ``data.yaml``) are left out, as detect.py leaves them out, and counted
  (:attr:`FramePlan.skipped_files <inputs.plans.FramePlan.skipped_files>`). Every other entry
  still becomes an item, of kind ``"broken"``, that yields one failed frame with its reason:
  ``"broken symlink -> target"``, ``"unreadable file (permission denied)"``, ``"not a regular
  file"``, ``"cannot open video"``, ``"cannot decode"`` (later, when read), ``"cannot list
  directory (...)"``. Hidden entries (names starting with ``.``: ``.git``, ``.DS_Store``,
  ``._x.jpg``) are left out, as ``ls`` and ``glob`` leave them out, and counted in
  :attr:`FramePlan.skipped <inputs.plans.FramePlan.skipped>` with the directories listed twice.
- a glob (``data/**/*.jpg``): the files it matches, classified like a directory's entries; the
  directories it matches are ignored (``**`` descends).
- a ``.txt`` list: one source per line (blank lines and ``#`` comments ignored): a path
  (relative to the list's folder) of an image, video, directory or glob, a URL, or a camera
  index. Lines that name nothing readable become ``"broken"`` items.
- ``feed:DIR``: frames written into one file per preprocess worker while the run goes on
  (:mod:`inputs.feed`; a cluster node's pipeline), open-ended.
- a camera index (``"0"``, ``"1"``): a live stream from ``cv2.VideoCapture(int)``. A source
  made of digits is always a camera; write ``./0`` for a file named ``0``.
- a URL of :data:`inputs.streams.URL_SCHEMES`. An http(s) URL is opened once here: with a known
  frame count it is a video, read frame by frame like a file; without one it is a live stream.
  A video from a server that does not answer Range requests is downloaded first where the
  caller gives ``StreamOptions.download_dir`` (see :mod:`inputs.downloads`).
  Other schemes (rtsp, rtmp, ...) are live streams and are not opened here.

- a source string an input kind registered from a plugin recognises (:mod:`inputs.kinds`): its
  items as that kind plans them. The input kinds are asked first, in the order registered
  (``"synthetic"``, a camera index and ``feed:DIR`` are the tree's own), then a URL, a glob and
  a path are tried.

A source that names nothing usable (a missing path, an empty directory, an unsupported or
unopenable single file, a glob that matches nothing) is a :class:`ValueError`.

:func:`plan_frames` turns a source into a :class:`~inputs.plans.FramePlan` (frame ids and worker
shares: see :mod:`inputs.plans`); :class:`~inputs.reader.ShareReader` reads one worker's share.
``FrameReader``, ``FrameReadError``, ``FrameRef`` and ``SYNTHETIC_SOURCE`` are re-exported for
existing callers.
"""

from __future__ import annotations

import dataclasses
import glob
import os
from inputs.builtin_kinds import broken_item as _broken, camera_items, video_item
from inputs.downloads import download, probe_ranges
from inputs.frames import FrameReadError, FrameRef, SourceItem
from inputs.kinds import Planning, file_extensions, file_kind, input_kinds, source_kind
from inputs.plans import FramePlan, plan_lengths
from inputs.reader import FrameReader, ShareReader
from inputs.streams import FILE_URL_SCHEMES, StreamOptions, is_camera, is_url, url_name
from inputs.synthetic import SYNTHETIC_SOURCE

__all__ = ["FramePlan", "FrameReadError", "FrameReader", "FrameRef", "ShareReader", "SourceItem", "plan_frames",
           "SYNTHETIC_SOURCE"]

LIST_EXTENSIONS = frozenset({".txt"})
GLOB_CHARS = frozenset("*?[")


def _relative_name(path: str, root: str) -> str:
    """``path`` relative to ``root``; a path outside ``root`` keeps its absolute form without
    the leading separator, so names never climb out of an output folder."""
    name = os.path.relpath(path, root)
    if name == os.pardir or name.startswith(os.pardir + os.sep):
        return os.path.abspath(path).lstrip(os.sep)
    return name


def _url_item(url: str, planning: Planning) -> SourceItem:
    if url.partition("://")[0].lower() not in FILE_URL_SCHEMES:
        return SourceItem("stream", url, url_name(url), None)
    options = planning.streams
    probe = probe_ranges(url, options.open_timeout_ms / 1000) if options.download_dir else None
    if probe is None or not probe.must_download:
        return video_item(url, url_name(url), planning)
    try:
        path = download(url, options.download_dir, probe.length, options.read_timeout_ms / 1000)
    except OSError as exc:
        return _broken(url, url_name(url), f"the server does not answer Range requests, so the video is downloaded "
                                           f"first, and that failed: {exc}")
    item = video_item(path, url_name(url), planning)
    return item if item.kind != "broken" else dataclasses.replace(item, location=url)


def _file_item(path: str, root: str, planning: Planning) -> SourceItem:
    """The item of one directory entry, glob match or list line naming a file: as the input
    kind that reads its extension makes it (inputs.kinds), else a broken entry."""
    name = _relative_name(path, root)
    if os.path.islink(path) and not os.path.exists(path):
        return _broken(path, name, f"broken symlink -> {os.readlink(path)}")
    if not os.path.exists(path):
        return _broken(path, name, "no such file or directory")
    if not os.path.isfile(path):
        return _broken(path, name, "not a regular file")
    if not os.access(path, os.R_OK):
        return _broken(path, name, "unreadable file (permission denied)")
    extension = os.path.splitext(path)[1].lower()
    kind = file_kind(extension)
    if kind is not None:
        return kind.file_item(path, name, planning) if kind.file_item else SourceItem(kind.name, path, name, 1)
    suffix = " (a list is read only as the source itself)" if extension in LIST_EXTENSIONS else ""
    return _broken(path, name, f"unsupported file type {extension or '(no extension)'}{suffix}")


def _walk(directory: str, root: str, planning: Planning) -> tuple[list[SourceItem], list[str], int]:
    """The items under ``directory`` sorted by name, notes on what was left out, and how many
    files were left out for not being images or videos."""
    items, skipped, hidden, not_media = [], [], 0, {}
    seen = {os.path.realpath(directory)}
    media = file_extensions()

    def unlistable(error: OSError) -> None:
        items.append(_broken(error.filename, _relative_name(error.filename, root),
                             f"cannot list directory ({error.strerror})"))

    for folder, dirs, files in os.walk(directory, onerror=unlistable, followlinks=True):
        kept = []
        for name in sorted(dirs, key=lambda d: (os.path.islink(os.path.join(folder, d)), d)):  # real ones first
            path = os.path.join(folder, name)
            if name.startswith("."):
                hidden += 1
            elif os.path.realpath(path) in seen:
                skipped.append(f"{_relative_name(path, root)}: a directory listed already ({os.path.realpath(path)})")
            else:
                seen.add(os.path.realpath(path))
                kept.append(name)
        dirs[:] = sorted(kept)
        for name in files:
            extension = os.path.splitext(name)[1].lower()
            if name.startswith("."):
                hidden += 1
            elif extension not in media:
                not_media[extension or "(no extension)"] = not_media.get(extension or "(no extension)", 0) + 1
            else:
                items.append(_file_item(os.path.join(folder, name), root, planning))
    where = _relative_name(directory, root)
    if hidden:
        skipped.append(f"{hidden} hidden entries (names starting with '.') under {where}")
    if not_media:
        kinds = ", ".join(f"{n} {ext}" for ext, n in sorted(not_media.items(), key=lambda kv: (-kv[1], kv[0])))
        skipped.append(f"{sum(not_media.values())} files that are not images or videos ({kinds}) under {where}")
    return sorted(items, key=lambda item: item.name), skipped, sum(not_media.values())


def _glob_root(pattern: str) -> str:
    """The deepest directory of ``pattern`` before its first wildcard component."""
    parts = os.path.abspath(pattern).split(os.sep)
    fixed = []
    for part in parts[:-1]:
        if GLOB_CHARS & set(part):
            break
        fixed.append(part)
    return os.sep.join(fixed) or os.sep


def _glob_items(pattern: str, root: str, planning: Planning) -> list[SourceItem]:
    matches = {os.path.abspath(p) for p in glob.glob(pattern, recursive=True)}
    files = [p for p in matches if not os.path.isdir(p)]
    return sorted((_file_item(p, root, planning) for p in files), key=lambda item: item.name)


def _list_items(path: str, planning: Planning) -> tuple[list[SourceItem], list[str], int]:
    """The items of a ``.txt`` list, in its order."""
    root = os.path.dirname(path)
    try:
        with open(path, encoding="utf-8") as f:
            lines = [line.strip() for line in f]
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"expected a readable UTF-8 list file, got {path!r} ({error})") from None
    items, skipped, not_media = [], [], 0
    for entry in (line for line in lines if line and not line.startswith("#")):
        if is_camera(entry):
            items.extend(camera_items(entry, planning))
            continue
        if is_url(entry):
            items.append(_url_item(entry, planning))
            continue
        target = os.path.join(root, os.path.expanduser(entry))
        if GLOB_CHARS & set(entry) and not os.path.exists(target):
            matched = _glob_items(target, root, planning)
            items.extend(matched or [_broken(target, _relative_name(target, root), "glob matched no file")])
        elif os.path.isdir(target):
            found, notes, left_out = _walk(target, root, planning)
            items.extend(found or [_broken(target, _relative_name(target, root), "directory holds no entry")])
            skipped.extend(notes)
            not_media += left_out
        else:
            items.append(_file_item(os.path.abspath(target), root, planning))
    if not items:
        raise ValueError(f"expected list file {path!r} to name at least one source, got none")
    return items, skipped, not_media


def _single_file_items(path: str, planning: Planning) -> list[SourceItem]:
    extension = os.path.splitext(path)[1].lower()
    item = _file_item(path, os.path.dirname(path), planning)
    if item.kind == "broken" and file_kind(extension) is not None:
        raise ValueError(f"expected an image or a video OpenCV can open, got {path!r}: {item.reason}")
    if item.kind == "broken":
        files = ", ".join(f"{kind.name} ({', '.join(sorted(kind.extensions))})" for kind in input_kinds()
                          if kind.extensions)
        raise ValueError(f"expected an {files} or list ({', '.join(sorted(LIST_EXTENSIONS))}) file, "
                         f"got extension {extension!r} in {path!r}")
    return [item]


def _discover(source: str, planning: Planning) -> tuple[list[SourceItem], str, list[str], int]:
    """``(items, root, skipped, skipped_files)`` of ``source``; names are relative to ``root``.
    A source an input kind recognises is that kind's to plan; the rest are URLs and paths."""
    kind = source_kind(source)
    if kind is not None:
        return kind.plan(source, planning), "", [], 0
    if is_url(source):
        item = _url_item(source, planning)
        if item.kind == "broken":
            raise ValueError(f"expected a URL OpenCV can open, got {item.name}: {item.reason}")
        return [item], "", [], 0
    if GLOB_CHARS & set(source) and not os.path.exists(source):
        root = _glob_root(source)
        items = _glob_items(source, root, planning)
        if not items:
            raise ValueError(f"expected glob {source!r} to match files, got none")
        return items, root, [], 0
    path = os.path.abspath(source)
    if os.path.islink(path) and not os.path.exists(path):
        raise ValueError(f"expected an existing source, got broken symlink {source!r} -> {os.readlink(path)}")
    if not os.path.exists(path):
        raise ValueError(f"expected {SYNTHETIC_SOURCE!r}, a directory, an image, a video, a list, a glob, a URL "
                         f"or a camera index, got nonexistent path {source!r}")
    if os.path.isdir(path):
        items, skipped, not_media = _walk(path, path, planning)
        if not items:
            raise ValueError(f"expected directory {source!r} to contain images or videos, got none"
                             + (f" ({'; '.join(skipped)})" if skipped else ""))
        return items, path, skipped, not_media
    if os.path.splitext(path)[1].lower() in LIST_EXTENSIONS:
        items, skipped, not_media = _list_items(path, planning)
        return items, os.path.dirname(path), skipped, not_media
    return _single_file_items(path, planning), os.path.dirname(path), [], 0


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"expected {name} to be an int >= {minimum}, got {value!r}")


def plan_frames(source: str, frames: int | None = None, synthetic_count: int = 64, vid_stride: int = 1,
                streams: StreamOptions | None = None) -> FramePlan:
    """Plan a run over ``source`` (see the module docstring).

    Args:
        source (str): ``"synthetic"``, a path, a glob, a ``.txt`` list, a URL or a camera index.
        frames (int | None): exactly this many frames, looping over a finite source as often as
            needed; None: one pass, or open-ended with a live stream.
        synthetic_count (int): how many scenes ``"synthetic"`` holds.
        vid_stride (int): read every ``vid_stride``-th frame of videos and live streams.
        streams (StreamOptions | None): the open timeout for probing http(s) URLs.

    Returns:
        FramePlan: plain data, to pass to every reader.

    Raises:
        ValueError: a source that names nothing usable, or a bad argument.
    """
    if frames is not None:
        _check_int("frames", frames, 1)
    _check_int("vid_stride", vid_stride, 1)
    planning = Planning(vid_stride, streams or StreamOptions(), synthetic_count)
    items, root, skipped, not_media = _discover(source, planning)
    lengths, total = plan_lengths(items, frames)
    return FramePlan(source, tuple(items), tuple(lengths), total, vid_stride, root, tuple(skipped), not_media)
