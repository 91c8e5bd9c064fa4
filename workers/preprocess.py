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
from topology.stages import consumers_of
from process.clock import Clock, poll, worker_stats
from process.control import Control, Heartbeat
from process.faults import TestFaults
from wire.frame_header import FrameHeader, VideoPlace
from process.lifecycle import enter_process, set_thread_counts, setup_logging
from wire.links import Downstream
from wire.messages import FAILED, RELEASE, validate
from sharedmem.slots import SHM_DIR, SlotRing, segment_name
from wire.wiring import StageArgs
from wire.transport import FRAME_LIMITS, DropCounter, ProtocolError, make_socket, recv_message, send_message
from inputs.frames import Frame, FrameReadError, StreamError
from inputs.imageio import DecodeOptions
from yolo.letterbox import LETTERBOX_STRIDE, bgr_to_rgb_chw, letterbox
from inputs.feed import FeedWaiting
from inputs.reader import ShareReader, open_share

log = logging.getLogger(__name__)

POLL_TIMEOUT_MS = 100
RETURNS_TYPES = frozenset({RELEASE})


def prepare(frame: Frame, t_read: float, cfg, keep_original: bool, pre: str,
            release_by: str) -> tuple[FrameHeader, list[np.ndarray]]:
    """Letterbox one frame read at ``t_read``: its header (geometry and timestamps) and its
    arrays (letterboxed RGB CHW uint8, then the BGR original when the image will be drawn)."""
    t_decoded = time.perf_counter()
    boxed, info = letterbox(frame.image, cfg.imgsz, LETTERBOX_STRIDE, rect=cfg.rect)
    chw = bgr_to_rgb_chw(boxed)  # the model's channel order, made here where it is cheapest
    t_done = time.perf_counter()
    ref = frame.ref
    video = None if frame.video is None else VideoPlace(ref.item, ref.index, frame.video.fps, frame.video.frames)
    header = FrameHeader(id=ref.frame_id, name=ref.name, cycle=ref.cycle, ratio=info.ratio, pad=tuple(info.pad),
                         orig_shape=tuple(info.original_shape), lb_shape=tuple(boxed.shape[:2]),
                         full_shape=tuple(frame.original_shape), reduction=frame.reduction,
                         keep_image=keep_original, pre=pre, release_by=release_by,
                         t={"read_start": t_read, "read_end": t_decoded, "pre_end": t_done}, video=video)
    return header, [chw, frame.image] if keep_original else [chw]


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

    def pack(self, header: FrameHeader, arrays: list[np.ndarray]) -> tuple[dict, list[np.ndarray]]:
        """The frame's message header, its arrays in a slot (named there) or else in the message."""
        if self.ring is None:
            refs, inline = [{"inline": i} for i in range(len(arrays))], arrays
        else:
            slot = self.ring.acquire(header.id)
            refs, inline = self.ring.store(slot, arrays)
        px = {"lb": refs[0], "orig": refs[1] if len(refs) > 1 else None}
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


def run(args: StageArgs) -> None:
    signals = enter_process(args)
    threads = set_thread_counts(args.torch_threads, args.opencv_threads, use_torch=False)
    log = setup_logging(args.name, args.log_path, args.config.log_level)
    cfg, plan = args.config, args.plan
    drops = DropCounter(log)
    ctx = zmq.Context()
    control = Control(ctx, args, drops)
    heartbeat = Heartbeat(ctx, args, signals)
    consumers = consumers_of(args.endpoints.counts, "pre")
    frames_out = Downstream(ctx, args.endpoints[args.name], consumers, args.identity, args.wire, drops)
    returns_in = make_socket(ctx, zmq.PULL, max_message_bytes=FRAME_LIMITS.header_bytes, curve=args.wire.curve,
                             curve_server=True)  # a larger message disconnects its sender, as on every bound socket
    returns_in.bind(args.endpoints[f"{args.name}-returns"])
    results_out = make_socket(ctx, zmq.PUSH, curve=args.wire.curve)
    results_out.connect(args.endpoints["collector"])
    slots = FramesOut(args)
    poller = zmq.Poller()
    for socket in (frames_out.socket, returns_in, control.socket):
        poller.register(socket, zmq.POLLIN)
    clock, faults = Clock(), TestFaults.for_role("pre")
    substages, sent = {"read": Samples(), "letterbox": Samples()}, 0
    reader = open_share(plan, args.index, args.endpoints.counts["pre"], args.start_position,
                        decode=DecodeOptions(cfg.decode, cfg.imgsz, cfg.max_pixels))
    handed = args.start_position  # ids of my share handed on (sent or failed), by me or a predecessor
    stream_errors: list[str] = []
    failures = FailureLog(log)
    in_hand = InHand(args.run_tag, args.name)  # the frame being read and sent, for the runner if this dies
    share_done = False
    try:
        ready = None  # a prepared frame waiting for credit
        while not control.check():
            heartbeat.tick()
            for notice in control.take_gone():
                frames_out.peer_gone(notice["name"], notice["incarnation"], notice["final"])
            frames_out.send_queued()
            more = not share_done and not control.draining()
            if ready is None and more and frames_out.all_peers_known() and slots.has_room():
                with clock.busy() as spent:
                    in_hand.hold(reader.position)
                    ready, share_done, waiting = _read_next(reader, slots, cfg, args, results_out, failures,
                                                            stream_errors, faults)
                if ready is None:
                    handed = reader.position
                    in_hand.hold(NOTHING)
                elif ready[0]["id"] >= cfg.warmup:
                    t = ready[0]["t"]
                    substages["read"].add((t["read_end"] - t["read_start"]) * 1e3)
                    substages["letterbox"].add((t["pre_end"] - t["read_end"]) * 1e3)
                    clock.add_frames(*spent, frames=1)
                heartbeat.position = handed
                if not waiting:
                    continue
            if ready is not None and frames_out.has_credit():
                if frames_out.send(*ready) is not None:  # else its consumer is gone: try another
                    sent += 1
                    handed = reader.position
                    in_hand.hold(NOTHING)
                    heartbeat.position = handed
                    ready = None
                continue
            if ready is None and not more and frames_out.finish(log):
                break
            events = poll(poller, POLL_TIMEOUT_MS, clock, blocked_on_output=ready is not None or not slots.has_room())
            if frames_out.socket in events:
                for frame_id in frames_out.handle():
                    slots.release(frame_id)
            if returns_in in events:
                _take_returns(returns_in, slots, args, drops)
            if control.socket in events:
                control.handle()
        if control.stop_reason or control.drain_reason:
            log.info("stopping: %s", control.stop_reason or control.drain_reason)
        send_message(results_out, worker_stats(
            args, "pre", threads, clock, sent, drops, bytes_out=frames_out.bytes_sent, messages_out=sent,
            substages_ms={k: v.to_dict() for k, v in substages.items()}, link="pre->infer",
            position=handed, share=reader.planned, held_by=frames_out.held_by(), resent=frames_out.resent_by,
            slots=slots.ring.count if slots.ring else 0, inline_arrays=slots.ring.inline_arrays if slots.ring else 0,
            stream_errors=stream_errors,
            streams=[dataclasses.asdict(s) for s in reader.stream_stats()]), token=args.wire.token)
    finally:
        failures.close()
        in_hand.close()
        reader.close()
        heartbeat.close()
        slots.close()
        for closable in (frames_out, control):
            closable.close()
        returns_in.close()
        results_out.close()
        ctx.term()


def _report_failed(ref, reason: str, args: StageArgs, results_out, failures: FailureLog,
                   repeat: bool = False) -> None:
    """``repeat``: a frame after a video given up fails for the reason already logged, said once."""
    if repeat:
        log.debug("frame %d (%s) failed: %s", ref.frame_id, ref.name, reason)
    else:
        failures.failed("frame %d (%s) failed: %s", ref.frame_id, ref.name, reason)
    failure = {"type": FAILED, "id": ref.frame_id, "name": ref.name, "stage": "pre", "worker": args.name,
               "reason": reason, "cycle": ref.cycle}
    if ref.kind in ("video", "stream"):
        failure["video"] = {"item": ref.item, "index": ref.index}
    send_message(results_out, failure, token=args.wire.token)


def _read_next(reader: ShareReader, slots: FramesOut, cfg, args: StageArgs, results_out,
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
                _report_failed(ref, args.poison_reason, args, results_out, failures)
                return None, False, False
        frame = reader.next()
    except FeedWaiting:
        return None, False, True
    except FrameReadError as exc:
        _report_failed(exc.ref, exc.reason, args, results_out, failures, repeat=exc.repeat)
        return None, False, False
    except StreamError as exc:
        failures.log.error("%s", exc)
        stream_errors.append(str(exc))
        return None, False, False
    if frame is None:
        return None, True, False
    faults.on_frames([frame.ref.name])
    save_every = cfg.save_every
    position = frame.ref.index if frame.video is not None else frame.ref.frame_id  # a video keeps every N-th of its own
    keep = save_every > 0 and position % save_every == 0
    release_by = "collector" if keep and frame.video is not None else "post" if keep else "infer"
    return slots.pack(*prepare(frame, t_read, cfg, keep, args.name, release_by)), False, False


def _take_returns(returns_in: zmq.Socket, slots: FramesOut, args: StageArgs, drops: DropCounter) -> None:
    while returns_in.poll(0):
        try:
            header = validate(recv_message(returns_in, token=args.wire.token).header, RETURNS_TYPES)
        except ProtocolError as exc:
            drops.note(exc, "returns")
            continue
        slots.release_items(header)

