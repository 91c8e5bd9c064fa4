"""The header a frame carries from preprocess through inference to postprocess: which frame, the
letterbox geometry that maps boxes back to its pixels, where its arrays are, and its timestamps.
Built once by preprocess, extended by inference, read by postprocess; checked once by each
receiver (:meth:`FrameHeader.from_message`), so no stage meets a missing or mistyped field."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from wire.messages import Failed, check_fields, schema_of
from yolo.letterbox import LetterboxInfo

SET_BY_INFERENCE = {"set_by": "infer"}  # a field a frame from preprocess does not have yet


@dataclass(frozen=True)
class VideoPlace:
    """A video frame's place: the planned item and its frame index there (the collector writes
    each video's frames in this order); fps and length as the video's header says."""

    item: int
    index: int
    fps: float | None = None
    frames: int | None = None

    @classmethod
    def from_message(cls, video: dict | None) -> VideoPlace | None:
        return None if video is None else cls(video["item"], video["index"], video.get("fps"), video.get("frames"))

    def to_message(self) -> dict:
        return {"item": self.item, "index": self.index, "fps": self.fps, "frames": self.frames}


@dataclass(frozen=True)
class FrameHeader:
    id: int
    name: str
    cycle: int  # which pass over the source (a --duration run loops it)
    ratio: float  # letterbox scale
    pad: tuple[float, float]
    orig_shape: tuple[int, int]  # (H, W) of the decoded image (a reduced decode's, when reduced)
    lb_shape: tuple[int, int]  # (H, W) letterboxed
    full_shape: tuple[int, int]  # (H, W) of the full-size frame
    reduction: int  # 1, or 2, 4, 8 for a reduced JPEG decode
    keep_image: bool  # this frame's annotated image is saved: its original travels too
    pre: str  # the preprocess worker that owns its slot
    release_by: str  # the stage that gives the slot back: infer, post or collector
    t: dict[str, float] = field(default_factory=dict)  # stage timestamps (perf_counter seconds)
    px: dict = field(default_factory=dict)  # where each array is: {"lb": ..., "orig": ..., "cands": ...}
    video: VideoPlace | None = None
    infer: str = field(default="", metadata=SET_BY_INFERENCE)
    batch: int = field(default=0, metadata=SET_BY_INFERENCE)
    cold: bool = field(default=False, metadata=SET_BY_INFERENCE)  # the first forward of its input shape (set-up time)

    @classmethod
    def from_message(cls, header: dict, sent_by: str) -> FrameHeader:
        """The header of a frame message from ``sent_by`` ("pre" or "infer"); ProtocolError if a
        field is missing or of the wrong type."""
        check_fields(header, _SCHEMAS[sent_by], "frame")
        values = {k: v for k, v in header.items() if k in _FIELD_NAMES}
        values.update(pad=tuple(header["pad"]), orig_shape=tuple(header["orig_shape"]),
                      lb_shape=tuple(header["lb_shape"]), full_shape=tuple(header["full_shape"]),
                      video=VideoPlace.from_message(header.get("video")))
        return cls(**values)

    def to_message(self) -> dict:
        """Field by field, not dataclasses.asdict (which deep-copies ``t`` and ``px``: 40 us a frame
        in every stage); the message shares those dicts, and is packed and sent at once."""
        message = {name: getattr(self, name) for name in _FIELD_ORDER}
        message.update(pad=list(self.pad), orig_shape=list(self.orig_shape), lb_shape=list(self.lb_shape),
                       full_shape=list(self.full_shape), video=self.video_message())
        return message

    def letterbox_info(self) -> LetterboxInfo:
        return LetterboxInfo(ratio=self.ratio, pad=self.pad, original_shape=self.orig_shape, shape=self.lb_shape)

    def video_message(self) -> dict | None:
        return None if self.video is None else self.video.to_message()

    def failed(self, stage: str, worker: str, reason: str) -> dict:
        """The FAILED message for this frame."""
        return Failed(self.id, self.name, stage, worker, reason, self.cycle, self.video_message()).to_message()


_FIELD_ORDER = tuple(f.name for f in dataclasses.fields(FrameHeader))  # once, not per frame
_FIELD_NAMES = frozenset(_FIELD_ORDER)
# The fields a stage relies on in a frame from preprocess, and from inference.
PRE_FRAME = schema_of(FrameHeader, leave_out=tuple(f.name for f in dataclasses.fields(FrameHeader)
                                                   if f.metadata == SET_BY_INFERENCE))
INFER_FRAME = schema_of(FrameHeader)
_SCHEMAS = {"pre": PRE_FRAME, "infer": INFER_FRAME}
