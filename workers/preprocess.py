"""Source + preprocess stage: read this worker's share of the frames, decode, letterbox, and
hand uint8 images to the inference pool within the credit each inference worker granted."""

from __future__ import annotations

import time

import numpy as np
import zmq

from workers.lifecycle import Clock, Control, StageArgs, poll, set_thread_counts, setup_logging, worker_stats
from workers.links import Downstream
from workers.transport import make_socket, send_message
from yolo.letterbox import bgr_to_rgb_chw, letterbox
from yolo.sources import FrameReader, FrameReadError

POLL_TIMEOUT_MS = 100
LETTERBOX_STRIDE = 32  # the max stride of every YOLOv5 P5 model; inference checks its model agrees


def prepare(reader: FrameReader, ref, cfg, stride: int, keep_original: bool, worker: str
            ) -> tuple[dict, list[np.ndarray]]:
    t_read = time.perf_counter()
    image = reader.read(ref)
    t_decoded = time.perf_counter()
    boxed, info = letterbox(image, cfg.imgsz, stride, rect=cfg.rect)
    t_done = time.perf_counter()
    header = {"id": ref.frame_id, "name": ref.name, "cycle": ref.cycle, "ratio": info.ratio,
              "pad": list(info.pad), "orig_shape": list(info.original_shape), "lb_shape": list(boxed.shape[:2]),
              "keep_image": keep_original, "pre": worker,
              "t": {"read_start": t_read, "read_end": t_decoded, "pre_end": t_done}}
    chw = bgr_to_rgb_chw(boxed)  # the model's channel order, made here where it is cheapest
    header["t"]["pre_end"] = time.perf_counter()
    return header, [chw, image] if keep_original else [chw]


def run(args: StageArgs) -> None:
    threads = set_thread_counts(args.torch_threads, args.opencv_threads)
    log = setup_logging(args.name, args.log_path, args.config.log_level)
    cfg, plan = args.config, args.plan
    ctx = zmq.Context()
    control = Control(ctx, args.endpoints.control, args.parent_pid)
    frames_out = Downstream(ctx, args.endpoints.pre[args.index], expected_peers=len(args.endpoints.infer))
    results_out = make_socket(ctx, zmq.PUSH)
    results_out.connect(args.endpoints.collector)
    poller = zmq.Poller()
    poller.register(frames_out.socket, zmq.POLLIN)
    poller.register(control.socket, zmq.POLLIN)
    clock, stride, save_every = Clock(), LETTERBOX_STRIDE, cfg.save_every
    read_ms, letterbox_ms, sent = [], [], 0
    try:
        ids = iter(plan.worker_ids(args.index, len(args.endpoints.pre)))
        ready = None  # a prepared frame waiting for credit
        with FrameReader() as reader:
            while not control.check():
                if ready is None and frames_out.all_peers_known():
                    frame_id = next(ids, None)
                    if frame_id is not None:
                        ref = plan.ref(frame_id)
                        t0 = time.perf_counter()
                        try:
                            ready = prepare(reader, ref, cfg, stride, save_every > 0 and frame_id % save_every == 0, args.name)
                        except FrameReadError as exc:
                            log.warning("frame %d (%s) failed: %s", frame_id, ref.name, exc)
                            send_message(results_out, {"type": "failed", "id": frame_id, "name": ref.name,
                                                       "stage": "pre", "worker": args.name, "reason": str(exc)})
                        clock.busy_s += time.perf_counter() - t0
                        if ready is not None and frame_id >= cfg.warmup:
                            t = ready[0]["t"]
                            read_ms.append((t["read_end"] - t["read_start"]) * 1e3)
                            letterbox_ms.append((t["pre_end"] - t["read_end"]) * 1e3)
                            clock.frame_ms.append((t["pre_end"] - t["read_start"]) * 1e3)
                        continue
                if ready is not None and frames_out.has_credit():
                    if frames_out.send(*ready) is not None:  # else its consumer is gone: try another
                        sent += 1
                        ready = None
                    continue
                if ready is None and frames_out.finish(log):  # every id read and sent
                    break
                events = poll(poller, POLL_TIMEOUT_MS, clock, blocked_on_output=ready is not None)
                if frames_out.socket in events:
                    frames_out.handle()
                if control.socket in events:
                    control.handle()
        if control.stop_reason:
            log.info("stopping: %s", control.stop_reason)
        send_message(results_out, worker_stats(
            args.name, "pre", "cpu", threads, clock, sent, bytes_out=frames_out.bytes_sent, messages_out=sent,
            substages_ms={"read": read_ms, "letterbox": letterbox_ms}, link="pre->infer"))
    finally:
        frames_out.close()
        results_out.close()
        control.close()
        ctx.term()
