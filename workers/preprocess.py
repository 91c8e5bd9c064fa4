"""Source + preprocess stage: read this worker's share of the frames, decode, letterbox, put the
pixels in a shared-memory slot of its own ring, and hand slot references to the inference pool
within the credit each inference worker granted. Imports no torch."""

from __future__ import annotations

import dataclasses
import logging
import time

import numpy as np
import zmq

from analysis.samples import Samples
from process.failure_log import FailureLog
from sharedmem.in_hand import NOTHING, InHand
from topology.stages import consumers_of, next_role, release_by
from process.faults import TestFaults
from process.stage_loop import Stage, StageProcess, run_loop
from wire.frame_header import FrameHeader, VideoPlace
from wire.links import Downstream
from wire.messages import RELEASE, Failed, validate
from sharedmem.slots import SHM_DIR, SlotRing, segment_name
from wire.wiring import StageArgs
from wire.transport import FRAME_LIMITS, DropCounter, ProtocolError, make_socket, recv_message
from inputs.frames import Frame, FrameReadError, StreamError
from inputs.imageio import DecodeOptions
from yolo.letterbox import LETTERBOX_STRIDE, letterbox_layout, letterbox_rgb_chw
from inputs.feed import FeedWaiting
from inputs.kinds import input_kind
from inputs.reader import open_share

log = logging.getLogger(__name__)

ROLE = "pre"
RETURNS_TYPES = frozenset({RELEASE})


def prepare(frame: Frame, t_read: float, cfg, keep_original: bool, pre: str,
            release_by: str, out: np.ndarray | None = None) -> tuple[FrameHeader, list[np.ndarray]]:
    """Letterbox one frame read at ``t_read``: its header (geometry and timestamps) and its
    arrays (letterboxed RGB CHW uint8, written into ``out`` when given, then the BGR original
    when the image will be drawn)."""
    t_decoded = time.perf_counter()
    # the model's channel order, made here where it is cheapest, written where it will be read
    chw, info = letterbox_rgb_chw(frame.image, cfg.imgsz, LETTERBOX_STRIDE, rect=cfg.rect, out=out)
    t_done = time.perf_counter()
    ref = frame.ref
    video = None if frame.video is None else VideoPlace(ref.item, ref.index, frame.video.fps, frame.video.frames)
    header = FrameHeader(id=ref.frame_id, name=ref.name, cycle=ref.cycle, ratio=info.ratio, pad=tuple(info.pad),
                         orig_shape=tuple(info.original_shape), lb_shape=tuple(info.shape),
                         full_shape=tuple(frame.original_shape), reduction=frame.reduction,
                         keep_image=keep_original, pre=pre, release_by=release_by,
                         t={"read_start": t_read, "read_end": t_decoded, "pre_end": t_done}, video=video)
    return header, [chw, frame.image] if keep_original else [chw]


def prepare_for_device(frame: Frame, t_read: float, keep_original: bool, pre: str,
                       release_by: str) -> tuple[FrameHeader, list[np.ndarray]]:
    """A frame for the device data path, undecoded: its file's bytes (or, for a frame only the
    host decodes, a video's say, its BGR pixels, which a kept video frame's collector also
    reads). Inference decodes and letterboxes it, and fills in the geometry left zero here."""
    t_done = time.perf_counter()
    ref = frame.ref
    video = None if frame.video is None else VideoPlace(ref.item, ref.index, frame.video.fps, frame.video.frames)
    data = frame.encoded if frame.encoded is not None else frame.image
    shape = tuple(frame.original_shape)
    header = FrameHeader(id=ref.frame_id, name=ref.name, cycle=ref.cycle, ratio=0.0, pad=(0.0, 0.0), orig_shape=shape,
                         lb_shape=(0, 0), full_shape=shape, reduction=1, keep_image=keep_original, pre=pre,
                         release_by=release_by, t={"read_start": t_read, "read_end": t_done, "pre_end": t_done},
                         video=video)
    return header, [data]


class FramesOut:
    """Puts a prepared frame's arrays in a slot of this worker's ring (or in the message when
    there is no ring, or the frame is larger than a slot) and takes slots back on release."""

    def __init__(self, args: StageArgs):
        self.ring = None
        if args.slot_bytes:
            try:
                self.ring = SlotRing(segment_name(args.run_tag, args.name, args.incarnation), args.slot_bytes,
                                     args.slot_count)
            except OSError as exc:  # shared memory full (ENOSPC): the frames still go, as bytes
                log.warning("%s: no room for %d x %.1f MB of frame slots in %s (%s): frames travel in the messages",
                            args.name, args.slot_count, args.slot_bytes / 1e6, SHM_DIR, exc.strerror or exc)

    def has_room(self) -> bool:
        return self.ring is None or self.ring.free_slots() > 0

    def pack(self, header: FrameHeader, arrays: list[np.ndarray], pixels_are_original: bool = False
             ) -> tuple[dict, list[np.ndarray]]:
        """The frame's message header, its arrays in a slot (named there) or else in the message;
        ``pixels_are_original``: the one array is also the original a stage after inference reads
        (the device path's kept video frame)."""
        if self.ring is None:
            refs, inline = [{"inline": i} for i in range(len(arrays))], arrays
        else:
            slot = self.ring.acquire(header.id)
            refs, inline = self.ring.store(slot, arrays)
        px = {"lb": refs[0], "orig": refs[1] if len(refs) > 1 else None}
        if pixels_are_original:
            px["orig"] = refs[0]
        return dataclasses.replace(header, px=px).to_message(), inline

    def prepare(self, frame: Frame, t_read: float, cfg, keep_original: bool, pre: str,
                release_by: str) -> tuple[dict, list[np.ndarray]]:
        """:func:`prepare` the frame straight into a slot (no letterboxed copy made first): its
        message header and the arrays that travel in the message."""
        if self.ring is None:
            return self.pack(*prepare(frame, t_read, cfg, keep_original, pre, release_by))
        lb_hw = letterbox_layout(frame.image.shape, cfg.imgsz, LETTERBOX_STRIDE, cfg.rect)[0].shape
        specs = [((3, *lb_hw), np.uint8)] + ([(frame.image.shape, frame.image.dtype)] if keep_original else [])
        refs, places = self.ring.reserve(self.ring.acquire(frame.ref.frame_id), specs)
        header, _ = prepare(frame, t_read, cfg, keep_original, pre, release_by, out=places[0])
        if keep_original:
            np.copyto(places[1], frame.image, casting="no")
        inline = [place for ref, place in zip(refs, places) if "inline" in ref]
        px = {"lb": refs[0], "orig": refs[1] if keep_original else None}
        return dataclasses.replace(header, px=px).to_message(), inline

    def release(self, frame_id: int) -> None:
        if self.ring is not None:
            self.ring.release_frame(frame_id)

    def release_items(self, header: dict) -> None:
        if self.ring is None or header["seg"] != self.ring.name:
            return  # my predecessor's slots, or a stranger's message
        for item in header["items"]:
            if isinstance(item, list) and len(item) == 2 and all(isinstance(v, int) for v in item):
                self.ring.release(item[0], item[1])

    def close(self) -> None:
        if self.ring is not None:
            self.ring.close(unlink=False)  # frames may still be read downstream; the runner removes it


class Preprocess(Stage):
    """Reads its share of the source, prepares each frame into a slot and hands it on within the
    credit the inference workers granted; takes slots back as they are released."""

    def __init__(self, process: StageProcess):
        args, cfg, plan = process.args, process.args.config, process.args.plan
        self.process, self.args, self.cfg = process, args, cfg
        self.frames_out = process.own(Downstream(process.ctx, args.endpoints[args.name],
                                     consumers_of(args.endpoints.counts, ROLE), args.identity, args.wire, process.drops))
        process.listen(self.frames_out.socket, self.take_acks)
        self.returns_in = process.own(make_socket(process.ctx, zmq.PULL, max_message_bytes=FRAME_LIMITS.header_bytes,
                                                  curve=args.wire.curve, curve_server=True))  # a larger message disconnects its sender, as on every bound socket
        self.returns_in.bind(args.endpoints[f"{args.name}-returns"])
        process.listen(self.returns_in, lambda socket: _take_returns(socket, self.slots, args, process.drops))
        self.slots = process.own(FramesOut(args))
        self.faults = TestFaults.for_role(ROLE)
        self.substages, self.sent = {"read": Samples(), "letterbox": Samples()}, 0
        self.reader = process.own(open_share(plan, args.index, args.endpoints.counts[ROLE], args.start_position,
                                decode=DecodeOptions(cfg.decode, cfg.imgsz, cfg.max_pixels),
                                encoded=cfg.data_path == "device"))
        self.handed = args.start_position  # ids of my share handed on (sent or failed), by me or a predecessor
        self.stream_errors: list[str] = []
        self.failures = process.own(FailureLog(process.log))
        self.in_hand = process.own(InHand(args.run_tag, args.name))  # the frame being read and sent, for the runner if this dies
        self.share_done = False
        self.ready = None  # a prepared frame waiting for credit

    def peer_gone(self, notice: dict) -> None:
        self.frames_out.peer_gone(notice["name"], notice["incarnation"], notice["final"])

    def more(self) -> bool:
        return not self.share_done and not self.process.control.draining()

    def step(self) -> bool:
        self.frames_out.send_queued()
        if self.ready is None and self.more() and self.frames_out.all_peers_known() and self.slots.has_room():
            waiting = self.read()
            if not waiting:
                return True
        if self.ready is not None and self.frames_out.has_credit():
            if self.frames_out.send(*self.ready) is not None:  # else its consumer is gone: try another
                self.sent += 1
                self.hand_on()
            return True
        return False

    def read(self) -> bool:
        """Read and prepare the next frame; True when a feed has no line yet (wait before asking again)."""
        heartbeat, clock = self.process.heartbeat, self.process.clock
        with clock.busy() as spent:
            self.in_hand.hold(self.reader.position)
            self.ready, self.share_done, waiting = _read_next(self.reader, self.slots, self.cfg, self.args,
                                                              self.process, self.failures, self.stream_errors,
                                                              self.faults)
        if self.ready is None:
            self.handed = self.reader.position
            self.in_hand.hold(NOTHING)
        elif self.ready[0]["id"] >= self.cfg.warmup:
            t = self.ready[0]["t"]
            self.substages["read"].add((t["read_end"] - t["read_start"]) * 1e3)
            self.substages["letterbox"].add((t["pre_end"] - t["read_end"]) * 1e3)
            clock.add_frames(*spent, frames=1)
        heartbeat.position = self.handed
        return waiting

    def hand_on(self) -> None:
        self.handed = self.reader.position
        self.in_hand.hold(NOTHING)
        self.process.heartbeat.position = self.handed
        self.ready = None

    def done(self) -> bool:
        return self.ready is None and not self.more() and self.frames_out.finish(self.process.log)

    def blocked_on_output(self) -> bool:
        return self.ready is not None or not self.slots.has_room()

    def take_acks(self, socket) -> None:
        for frame_id in self.frames_out.handle():
            self.slots.release(frame_id)

    def finish(self) -> None:
        ring, frames_out = self.slots.ring, self.frames_out
        self.process.tell_collector(self.process.summary(
            ROLE, self.sent, bytes_out=frames_out.bytes_sent, messages_out=self.sent,
            substages_ms={k: v.to_dict() for k, v in self.substages.items()}, link=f"{ROLE}->{next_role(ROLE)}",
            position=self.handed, share=self.reader.planned, held_by=frames_out.held_by(),
            resent=frames_out.resent_by, slots=ring.count if ring else 0, inline_arrays=ring.inline_arrays if ring else 0,
            stream_errors=self.stream_errors, streams=[dataclasses.asdict(s) for s in self.reader.stream_stats()]))


def run(args: StageArgs) -> None:
    process = StageProcess(args, use_torch=False)
    run_loop(process, Preprocess(process))


def _report_failed(ref, reason: str, args: StageArgs, process: StageProcess, failures: FailureLog,
                   repeat: bool = False) -> None:
    """``repeat``: a frame after a video given up fails for the reason already logged, said once."""
    if repeat:
        log.debug("frame %d (%s) failed: %s", ref.frame_id, ref.name, reason)
    else:
        failures.failed("frame %d (%s) failed: %s", ref.frame_id, ref.name, reason)
    video = {"item": ref.item, "index": ref.index} if input_kind(ref.kind).video else None
    process.tell_collector(Failed(ref.frame_id, ref.name, ROLE, args.name, reason, ref.cycle, video).to_message())


def _read_next(reader, slots: FramesOut, cfg, args: StageArgs, process: StageProcess,
               failures: FailureLog, stream_errors: list[str], faults: TestFaults
               ) -> tuple[tuple[dict, list] | None, bool, bool]:
    """(the next frame prepared and packed into a slot, or None; whether the share is done;
    whether a feed has no line yet, so the caller polls before asking again). A frame that
    cannot be read is reported failed; a stream given up is logged once."""
    t_read = time.perf_counter()
    try:
        if reader.position == args.poison_position:
            ref = reader.skip()
            if ref is not None:
                _report_failed(ref, args.poison_reason, args, process, failures)
                return None, False, False
        frame = reader.next()
    except FeedWaiting:
        return None, False, True
    except FrameReadError as exc:
        _report_failed(exc.ref, exc.reason, args, process, failures, repeat=exc.repeat)
        return None, False, False
    except StreamError as exc:
        failures.log.error("%s", exc)
        stream_errors.append(str(exc))
        return None, False, False
    if frame is None:
        return None, True, False
    faults.on_frames([frame.ref.name])
    save_every = cfg.save_every
    position = frame.ref.save_number  # what the run counts: a cluster driver's, or else the frame's own
    if position < 0:
        position = frame.ref.index if frame.video is not None else frame.ref.frame_id  # a video keeps every N-th of its own
    keep = save_every > 0 and position % save_every == 0
    video = frame.video is not None
    if cfg.data_path == "device":  # inference decodes, draws and encodes: only a kept video frame's slot outlives it
        releaser = release_by(keep and video, video=video)
        return slots.pack(*prepare_for_device(frame, t_read, keep, args.name, releaser),
                          pixels_are_original=keep and video), False, False
    return slots.prepare(frame, t_read, cfg, keep, args.name, release_by(keep, video=video)), False, False


def _take_returns(returns_in: zmq.Socket, slots: FramesOut, args: StageArgs, drops: DropCounter) -> None:
    while returns_in.poll(0):
        try:
            header = validate(recv_message(returns_in, token=args.wire.token).header, RETURNS_TYPES)
        except ProtocolError as exc:
            drops.note(exc, "returns")
            continue
        slots.release_items(header)

