"""The input kinds by name: what an item of a source is, how a source string or a file is
recognised and planned into items, how an item's frames are read, and what the rest of the
tree needs to know of it (live, a video). Every ``kind`` string of a
:class:`~inputs.frames.SourceItem` or :class:`~inputs.frames.FrameRef` names one.

The tree's kinds: ``"image"`` and ``"video"`` files (by extension), ``"stream"`` (a camera index;
a live URL is planned as one too), ``"synthetic"`` scenes, ``"feed"`` files (``feed:DIR``) and
``"broken"`` entries. A new kind is one module that calls :func:`register`, for instance a
plugin named in ``YOLO_PIPELINE_PLUGINS`` (topology/plugins.py), which every process imports::

    register(InputKind("solid", read=read_solid, recognise=lambda s: s.startswith("solid:"),
                       plan=plan_solid))

Everything here reads the registry when called, so a kind registered after this module was
imported counts everywhere. A source string is tried against the kinds' ``recognise`` in the
order they were registered, before it is taken for a URL, a glob or a path
(:mod:`inputs.sources`); ``recognise`` looks at the string only (no file system, no network).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from inputs import builtin_kinds as builtin
from inputs import feed
from inputs.feed import FeedReader, check_feed_workers, feed_items, is_feed
from inputs import object_store
from inputs.frames import IMAGE_EXTENSIONS, VIDEO_EXTENSIONS, Frame, FrameRef, SourceItem
from inputs.streams import StreamOptions, is_camera
from inputs.synthetic import SYNTHETIC_SOURCE



@dataclass(frozen=True)
class Planning:
    """What planning a source into items may use: ``vid_stride`` (every n-th frame of a video
    or stream), the stream options (timeouts, downloads), how many scenes ``"synthetic"`` holds."""

    vid_stride: int = 1
    streams: StreamOptions = field(default_factory=StreamOptions)
    synthetic_count: int = 64


@dataclass(frozen=True)
class InputKind:
    """One input kind. Every part is optional: a kind reached only through others (a broken
    entry) needs only ``read``; a live one ``open_live`` or a ``share_reader`` instead.

    Attributes:
        name: the ``kind`` of its items and frames.
        read: ``(ref, reader) -> Frame``, a finite frame by its ref; raises
            :class:`~inputs.frames.FrameReadError` for a frame that cannot be read. ``reader``
            (:class:`inputs.reader.FrameReader`) has ``decode``, ``streams``, ``seed``,
            ``vid_stride``, ``opener``, ``held`` (what stays open between reads, closed with
            the reader) and ``given_up``.
        read_encoded: ``(ref, reader) -> Frame`` with ``encoded`` bytes and no ``image``: a
            frame of an encoded file, read for the device data path to decode on the device;
            None: the kind's frames are decoded on the host there too (``read``).
        live: its frames come as the source makes them (a camera): no planned length, only the
            newest frame kept, one worker reads the item.
        video: its frames have a place in a video (numbered ``name:000001``, read whole and in
            order by one worker, an annotated video written from them).
        numbered_by_item: a frame's number in its source is its item's index (a synthetic scene).
        recognise: ``(source) -> bool``, a source string that is this kind's.
        plan: ``(source, planning) -> [SourceItem]``, the items of a recognised source;
            ValueError when it names nothing usable.
        extensions: file extensions of this kind in a folder, a glob, a list or as the source.
        file_item: ``(path, name, planning) -> SourceItem``, the item of such a file; None: one
            frame of this kind.
        open_live: ``(item, index, reader) -> stream``, a live item's frames: the stream has
            ``next() -> (source_index, image, VideoInfo)``, ``stop()``, ``close()``, ``stats()``
            (see :class:`inputs.streams.LiveStream`).
        share_reader: ``(plan, worker, workers, start, frames=FrameReader) -> reader``, a reader
            of a whole worker's share of a source this kind recognised, instead of
            :class:`inputs.reader.ShareReader` (the feed's :class:`inputs.feed.FeedReader`).
        check_workers: ``(plan, readers)``, ValueError when the plan cannot be read by that
            many preprocess workers (a feed needs one per file).
        frame_sizes: ``([SourceItem]) -> [(H, W)]``, the frame sizes of items of this kind, as
            far as they are known cheaply (the frame slots are sized from them).
    """

    name: str
    read: Callable[[FrameRef, Any], Frame] | None = None
    read_encoded: Callable[[FrameRef, Any], Frame] | None = None
    live: bool = False
    video: bool = False
    numbered_by_item: bool = False
    recognise: Callable[[str], bool] | None = None
    plan: Callable[[str, Planning], list[SourceItem]] | None = None
    extensions: frozenset[str] = frozenset()
    file_item: Callable[[str, str, Planning], SourceItem] | None = None
    open_live: Callable[[SourceItem, int, Any], Any] | None = None
    share_reader: Callable[..., Any] | None = None
    check_workers: Callable[[Any, int], None] | None = None
    frame_sizes: Callable[[list[SourceItem]], list[tuple[int, int]]] | None = None


_KINDS: dict[str, InputKind] = {kind.name: kind for kind in (
    InputKind("synthetic", read=builtin.read_synthetic, numbered_by_item=True,
              recognise=lambda source: source == SYNTHETIC_SOURCE, plan=builtin.synthetic_items,
              frame_sizes=builtin.synthetic_sizes),
    InputKind("stream", live=True, video=True, recognise=is_camera, plan=builtin.camera_items,
              open_live=builtin.open_stream),
    InputKind("feed", live=True, video=True, recognise=is_feed, plan=lambda source, planning: feed_items(source),
              share_reader=FeedReader, check_workers=check_feed_workers),
    InputKind("image", read=builtin.read_image_file, read_encoded=builtin.read_image_file_encoded,
              extensions=IMAGE_EXTENSIONS, frame_sizes=builtin.image_sizes),
    InputKind("video", read=builtin.read_video_frame, video=True, extensions=VIDEO_EXTENSIONS,
              file_item=builtin.video_item, frame_sizes=builtin.video_sizes),
    InputKind("broken", read=builtin.read_broken),
    InputKind(object_store.KIND, read=object_store.read_stored, read_encoded=object_store.read_stored_encoded,
              recognise=object_store.is_store_url,
              plan=object_store.plan_store, frame_sizes=object_store.stored_sizes),
)}


def register(kind: InputKind) -> InputKind:
    """Add ``kind`` (the same kind again is a no-op: a plugin may be imported twice); returns it.
    ValueError when another kind has its name or claims one of its extensions."""
    if (kind.recognise is None) != (kind.plan is None):
        raise ValueError(f"expected input kind {kind.name!r} to give recognise and plan together, got only one")
    known = _KINDS.get(kind.name)
    if known is not None and known != kind:
        raise ValueError(f"expected a new input kind name, got {kind.name!r}, registered already as {known}")
    taken = {ext: other.name for other in _KINDS.values() if other.name != kind.name for ext in other.extensions}
    claimed = sorted(ext for ext in kind.extensions if ext in taken)
    if claimed:
        raise ValueError(f"expected file extensions no other input kind reads, got {', '.join(claimed)} for "
                         f"{kind.name!r} (read as {', '.join(sorted({taken[ext] for ext in claimed}))})")
    _KINDS[kind.name] = kind
    return kind


def unregister(name: str) -> None:
    """Remove the kind ``name`` (a test's own); nothing happens when there is none."""
    _KINDS.pop(name, None)


def input_kind(name: str) -> InputKind:
    """The kind ``name``; ValueError naming the known ones when there is none."""
    kind = _KINDS.get(name)
    if kind is None:
        raise ValueError(f"expected an input kind of {', '.join(_KINDS)}, got {name!r} (a plugin's kind needs "
                         "its plugin imported in every process: YOLO_PIPELINE_PLUGINS)")
    return kind


def planned_frame_sizes(items: list[SourceItem]) -> list[tuple[int, int]]:
    """``(H, W)`` of the items' frames as far as their kinds tell them cheaply (videos: what
    planning probed; images: the headers of the first few; synthetic scenes): the frame slots
    are sized, and the inference workers' input shapes warmed, from them."""
    by_kind: dict[str, list[SourceItem]] = {}
    for item in items:
        by_kind.setdefault(item.kind, []).append(item)
    sizes = []
    for name, group in by_kind.items():
        frame_sizes = input_kind(name).frame_sizes
        sizes += frame_sizes(group) if frame_sizes is not None else []
    return sizes


def input_kinds() -> tuple[InputKind, ...]:
    """Every registered kind, in the order registered."""
    return tuple(_KINDS.values())


def source_kind(source: str) -> InputKind | None:
    """The first kind whose ``recognise`` takes ``source``; None for a URL, glob or path."""
    return next((kind for kind in _KINDS.values() if kind.recognise is not None and kind.recognise(source)), None)


def file_kind(extension: str) -> InputKind | None:
    """The kind that reads files with ``extension`` (lower case, with its dot), or None."""
    return next((kind for kind in _KINDS.values() if extension in kind.extensions), None)


def file_extensions() -> frozenset[str]:
    """The extensions of every kind's files: the rest of a folder is left out."""
    return frozenset(ext for kind in _KINDS.values() for ext in kind.extensions)



def _finite(name: str) -> bool:
    """A kind whose frames are read one by one (what a feed line may name)."""
    kind = _KINDS.get(name)
    return kind is not None and kind.read is not None and not kind.live and not kind.video


feed.accept_kinds(_finite)
