"""Inference stage: the model wrapped by the TimedModule crawler; gathers frames of the same
letterboxed shape into batches, runs them on its device, and sends each frame's candidate
rows (those above conf_thres, not the raw prediction) to the postprocess pool."""

from __future__ import annotations

import collections
import math
import time

import numpy as np
import torch
import torch.nn as nn
import zmq

from workers.lifecycle import Clock, Control, StageArgs, poll, set_thread_counts, setup_logging, worker_stats
from workers.links import Downstream, Upstream
from workers.preprocess import LETTERBOX_STRIDE
from workers.transport import make_socket, send_message
from yolo.checkpoint import load_model
from yolo.detect import DetectOptions, candidates_for_batch
from yolo.model import C3, SPPF, Bottleneck, Conv, Detect
from yolo.tensors import chw_batch_to_input
from yolo.timing import default_timing_mode, instrument

POLL_TIMEOUT_MS = 100
MAX_PINNED_SHAPES = 16


def instrument_model(model: nn.Module, cfg, device: torch.device):
    if cfg.module_timing == "none":
        return None
    mode = default_timing_mode(device) if cfg.timing_mode == "auto" else cfg.timing_mode
    selection = {"layers": {"depth": 2}, "blocks": {"types": (Conv, Bottleneck, C3, SPPF, Detect)},
                 "leaves": {"leaves": True}}[cfg.module_timing]
    return instrument(model, mode=mode, keep_span_forwards=cfg.trace_module_forwards, **selection)


class BatchInput:
    """Turns received uint8 3xHxW RGB frames into the model's float batch on the device,
    through a reused pinned buffer and a non-blocking copy on CUDA."""

    def __init__(self, device: torch.device, half: bool):
        self.device = device
        self.dtype = torch.float16 if half else torch.float32
        self.pinned: dict[tuple, torch.Tensor] = {}

    def __call__(self, images: list[np.ndarray]) -> torch.Tensor:
        shape = (len(images),) + images[0].shape
        if self.device.type == "cuda":
            if shape not in self.pinned:
                if len(self.pinned) >= MAX_PINNED_SHAPES:
                    self.pinned.clear()
                self.pinned[shape] = torch.empty(shape, dtype=torch.uint8).pin_memory()
            host = self.pinned[shape]  # safe to refill: the last batch's copy finished at its sync
            np.stack(images, out=host.numpy())
        else:
            host = torch.from_numpy(np.stack(images))
        return chw_batch_to_input(host, self.device, self.dtype)


def run(args: StageArgs) -> None:
    threads = set_thread_counts(args.torch_threads, args.opencv_threads)
    log = setup_logging(args.name, args.log_path, args.config.log_level)
    cfg = args.config
    device = torch.device(args.device)
    model = load_model(cfg.weights or None, preset=cfg.preset, device=device, half=cfg.half, fuse=cfg.fuse,
                       inplace=cfg.inplace, channels_last=cfg.channels_last)
    if model.max_stride != LETTERBOX_STRIDE:
        raise RuntimeError(f"expected a model of max stride {LETTERBOX_STRIDE}, got {model.max_stride}")
    timing = instrument_model(model, cfg, device)
    opts = cfg.detect_options()
    to_batch = BatchInput(device, cfg.half)
    n_pre, n_post = len(args.endpoints.pre), cfg.post_workers
    ctx = zmq.Context()
    control = Control(ctx, args.endpoints.control, args.parent_pid)
    frames_in = Upstream(ctx, list(args.endpoints.pre), args.name,
                         credit_per_producer=max(1, math.ceil(cfg.batch_size * cfg.prefetch / n_pre)))
    frames_out = Downstream(ctx, args.endpoints.infer[args.index], expected_peers=n_post)
    results_out = make_socket(ctx, zmq.PUSH)
    results_out.connect(args.endpoints.collector)
    poller = zmq.Poller()
    for socket in frames_in.sockets:
        poller.register(socket, zmq.POLLIN)
    poller.register(frames_out.socket, zmq.POLLIN)
    poller.register(control.socket, zmq.POLLIN)
    clock = Clock()
    waiting: dict[tuple, list] = collections.defaultdict(list)  # letterboxed shape -> [(t_recv, msg)]
    outbox: collections.deque = collections.deque()  # (header, arrays) ready for the postprocess pool
    substages = {"to_device": [], "forward": [], "select": []}
    batches = frames = 0
    log.info("model on %s: %d parameters, timing %s, %s", device, model.num_params(), cfg.module_timing,
             timing.recorder.mode if timing else "off")
    try:
        started = False
        while not control.check():
            if not started and frames_out.all_peers_known():
                # Grant credit upstream only once every postprocess worker is up, so no frame is
                # read (and timed) before the whole pipeline can carry it.
                frames_in.start()
                started = True
            while outbox and frames_out.has_credit():
                header, arrays = outbox[0]
                if frames_out.send(header, arrays) is None:
                    continue  # that consumer is gone; try the others
                outbox.popleft()
                frames_in.ack(header["id"])
            due = _due_batch(waiting, cfg, frames_in.all_ended())
            if due is not None and len(outbox) < cfg.batch_size:
                group, waiting[due] = waiting[due][:cfg.batch_size], waiting[due][cfg.batch_size:]
                if not waiting[due]:
                    del waiting[due]
                t0 = time.perf_counter()
                measured = all(m.header["id"] >= cfg.warmup for _, m in group)
                if timing:
                    timing.recorder.measuring = measured
                outbox.extend(_infer(model, to_batch, opts, group, substages, measured, args.name))
                elapsed = time.perf_counter() - t0
                clock.busy_s += elapsed
                if measured:
                    clock.frame_ms.extend([elapsed * 1e3 / len(group)] * len(group))
                batches += 1
                frames += len(group)
                continue
            if frames_in.all_ended() and not waiting and not outbox and frames_out.finish(log):
                break
            blocked = len(outbox) >= cfg.batch_size  # no batch may run until postprocess takes some
            timeout_ms = POLL_TIMEOUT_MS if blocked else _poll_timeout_ms(waiting, cfg)
            events = poll(poller, timeout_ms, clock, blocked_on_output=bool(outbox))
            for socket in frames_in.sockets:
                if socket in events:
                    msg = frames_in.receive(socket)
                    if msg is not None:
                        shape = tuple(msg.arrays[0].shape)
                        waiting[shape].append((time.perf_counter(), msg))
            if frames_out.socket in events:
                frames_out.handle()
            if control.socket in events:
                control.handle()
        if control.stop_reason:
            log.info("stopping: %s", control.stop_reason)
        exported = _export_timing(timing)
        send_message(results_out, worker_stats(
            args.name, "infer", str(device), threads, clock, frames, batches=batches,
            bytes_in=frames_in.bytes_received, bytes_out=frames_out.bytes_sent,
            messages_in=frames_in.frames_received, messages_out=frames_out.frames_sent,
            substages_ms=substages, link="infer->post", timing=exported))
    finally:
        frames_in.close()
        frames_out.close()
        results_out.close()
        control.close()
        ctx.term()


def _due_batch(waiting: dict, cfg, inputs_ended: bool):
    """The shape whose batch should run now: full, waited max_wait_ms, or no more input coming."""
    now = time.perf_counter()
    oldest_shape, oldest_t = None, math.inf
    for shape, items in waiting.items():
        if not items:
            continue
        if len(items) >= cfg.batch_size:
            return shape
        if items[0][0] < oldest_t:
            oldest_shape, oldest_t = shape, items[0][0]
    if oldest_shape is not None and (inputs_ended or (now - oldest_t) * 1e3 >= cfg.max_wait_ms):
        return oldest_shape
    return None


def _poll_timeout_ms(waiting: dict, cfg) -> float:
    oldest = min((items[0][0] for items in waiting.values() if items), default=None)
    if oldest is None:
        return POLL_TIMEOUT_MS
    return max(0.0, min(POLL_TIMEOUT_MS, cfg.max_wait_ms - (time.perf_counter() - oldest) * 1e3))


def _infer(model, to_batch: BatchInput, opts: DetectOptions, group: list, substages: dict,
           measured: bool, worker: str) -> list[tuple[dict, list]]:
    msgs = [m for _, m in group]
    t_start = time.perf_counter()
    with torch.inference_mode():
        x = to_batch([m.arrays[0] for m in msgs])
        t_device = time.perf_counter()
        prediction = model(x)
        t_forward = time.perf_counter()
        candidates = candidates_for_batch(prediction, opts)  # .cpu() here waits for the GPU
    t_end = time.perf_counter()
    if measured:
        substages["to_device"].append((t_device - t_start) * 1e3)
        substages["forward"].append((t_forward - t_device) * 1e3)
        substages["select"].append((t_end - t_forward) * 1e3)
    out = []
    for (t_recv, msg), cands in zip(group, candidates):
        header = dict(msg.header)
        header.pop("type", None)
        header["t"] = {**header["t"], "infer_recv": t_recv, "infer_start": t_start, "infer_end": t_end}
        header["batch"] = len(group)
        header["infer"] = worker
        arrays = [cands.numpy()] + msg.arrays[1:]  # the original image travels on untouched
        out.append((header, arrays))
    return out


def _export_timing(timing) -> dict | None:
    if timing is None:
        return None
    exported = timing.recorder.export()
    exported["forward_ms"] = exported["forward_ms"].tolist()
    exported["residual_ms"] = exported["residual_ms"].tolist()
    for m in exported["modules"]:
        m["times_ms"] = m["times_ms"].tolist()
    exported["spans"] = [list(s) for s in timing.recorder.spans]
    return exported
