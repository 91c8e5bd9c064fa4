"""Postprocess stage: NMS on the candidate rows, boxes back to original pixels, draw and save
the annotated image when this frame is one to keep, and send the detections to the collector."""

from __future__ import annotations

import os
import time

import torch
import zmq

from workers.lifecycle import Clock, Control, StageArgs, poll, set_thread_counts, setup_logging, worker_stats
from workers.links import Upstream
from workers.transport import make_socket, send_message
from yolo.detect import annotated_name, detection_records, final_detections, save_image
from yolo.draw import draw_detections
from yolo.letterbox import LetterboxInfo

POLL_TIMEOUT_MS = 100


def postprocess(msg, opts, names, images_dir: str, substages: dict, measured: bool) -> dict:
    h = msg.header
    t_start = time.perf_counter()
    info = LetterboxInfo(ratio=h["ratio"], pad=tuple(h["pad"]), original_shape=tuple(h["orig_shape"]),
                         shape=tuple(h["lb_shape"]))
    dets = final_detections(torch.from_numpy(msg.arrays[0].copy()), info, opts)
    t_nms = time.perf_counter()
    saved = False
    t_draw = t_nms
    if h["keep_image"] and len(msg.arrays) > 1:
        image = msg.arrays[1].copy()  # received buffers are read-only
        draw_detections(image, dets, names, inplace=True)
        t_draw = time.perf_counter()
        save_image(os.path.join(images_dir, annotated_name(h["name"], h["cycle"])), image)
        saved = True
    t_end = time.perf_counter()
    if measured:
        substages["nms"].append((t_nms - t_start) * 1e3)
        if saved:
            substages["draw"].append((t_draw - t_nms) * 1e3)
            substages["save"].append((t_end - t_draw) * 1e3)
    result = {"type": "result", "id": h["id"], "name": h["name"], "batch": h["batch"],
              "t": {**h["t"], "post_start": t_start, "post_end": t_end}, "image_saved": saved,
              "detections": detection_records(dets, h["name"], h["id"], names)}
    return result


def run(args: StageArgs) -> None:
    threads = set_thread_counts(args.torch_threads, args.opencv_threads)
    log = setup_logging(args.name, args.log_path, args.config.log_level)
    cfg = args.config
    opts = cfg.detect_options()
    names = list(args.names)
    images_dir = os.path.join(args.run_dir, "images")
    ctx = zmq.Context()
    control = Control(ctx, args.endpoints.control, args.parent_pid)
    frames_in = Upstream(ctx, list(args.endpoints.infer), args.name, credit_per_producer=cfg.prefetch)
    results_out = make_socket(ctx, zmq.PUSH)
    results_out.connect(args.endpoints.collector)
    poller = zmq.Poller()
    for socket in frames_in.sockets:
        poller.register(socket, zmq.POLLIN)
    poller.register(control.socket, zmq.POLLIN)
    clock = Clock()
    substages = {"nms": [], "draw": [], "save": []}
    frames = bytes_out = 0
    frames_in.start()
    try:
        while not control.check() and not frames_in.all_ended():
            events = poll(poller, POLL_TIMEOUT_MS, clock, blocked_on_output=False)
            for socket in frames_in.sockets:
                if socket not in events:
                    continue
                msg = frames_in.receive(socket)
                if msg is None:
                    continue
                t0 = time.perf_counter()
                measured = msg.header["id"] >= cfg.warmup
                try:
                    result = postprocess(msg, opts, names, images_dir, substages, measured)
                    result["workers"] = {"pre": msg.header.get("pre"), "infer": msg.header.get("infer"),
                                         "post": args.name}
                    bytes_out += send_message(results_out, result)
                except Exception as exc:  # one bad frame must not take the stage down
                    log.exception("frame %d failed in postprocess", msg.header["id"])
                    send_message(results_out, {"type": "failed", "id": msg.header["id"], "name": msg.header["name"],
                                               "stage": "post", "worker": args.name, "reason": repr(exc)})
                frames_in.ack(msg.header["id"])
                elapsed = time.perf_counter() - t0
                clock.busy_s += elapsed
                if measured:
                    clock.frame_ms.append(elapsed * 1e3)
                frames += 1
            if control.socket in events:
                control.handle()
        if control.stop_reason:
            log.info("stopping: %s", control.stop_reason)
        send_message(results_out, worker_stats(
            args.name, "post", "cpu", threads, clock, frames, bytes_in=frames_in.bytes_received,
            bytes_out=bytes_out, messages_in=frames_in.frames_received, messages_out=frames,
            substages_ms=substages, link="post->collector"))
    finally:
        frames_in.close()
        results_out.close()
        control.close()
        ctx.term()
