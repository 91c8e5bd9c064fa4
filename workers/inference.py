"""Inference stage: the model wrapped by the TimedModule crawler; gathers frames of the same
letterboxed shape into batches, reads their pixels from the preprocess workers' shared-memory
slots, runs them on its device, and sends each frame's candidate rows (those above conf_thres,
not the raw prediction) to the postprocess pool. With ``--preset none`` there is no model: it
answers at once with no candidates, so a run measures what the pipeline itself can carry."""

from __future__ import annotations

import collections
import logging
import math
import time

import numpy as np
import torch
import torch.nn as nn
import zmq

from analysis.samples import Samples
from workers.in_hand import InHand
from workers.lifecycle import (Clock, Control, Heartbeat, StageArgs, burn_cpu, enter_process, poll, set_thread_counts,
                               setup_logging, test_crash, test_slowdown_ms, worker_stats)
from workers.links import Downstream, Upstream
from workers.messages import FAILED, PRE_FRAME, check_fields
from workers.preprocess import LETTERBOX_STRIDE
from workers.slots import SlotError, SlotViews
from workers.transport import DropCounter, ProtocolError, make_socket, send_message
from yolo.checkpoint import load_model
from yolo.detect import DetectOptions, candidates_for_batch
from yolo.model import C3, SPPF, Bottleneck, Conv, Detect
from yolo.precision import choose_precision
from yolo.presets import MODEL_FREE
from yolo.tensors import BatchInput, batch_bucket
from yolo.timing import default_timing_mode, instrument

POLL_TIMEOUT_MS = 100
NO_CANDIDATES = np.zeros((0, 6), np.float32)


def instrument_model(model: nn.Module, cfg, device: torch.device):
    if cfg.module_timing == "none":
        return None
    mode = default_timing_mode(device) if cfg.timing_mode == "auto" else cfg.timing_mode
    selection = {"layers": {"depth": 2}, "blocks": {"types": (Conv, Bottleneck, C3, SPPF, Detect)},
                 "leaves": {"leaves": True}}[cfg.module_timing]
    return instrument(model, mode=mode, keep_span_forwards=cfg.trace_module_forwards, **selection)


def load_backend(cfg, device: torch.device, precision: str, threads: int):
    """(the model, its module timing or None) for ``cfg.backend``: torch's model wrapped by
    ``TimedModule``, or the OpenVINO model (converted by the runner beforehand) timed by its own
    counters. Both are called alike: float batch in, decoded predictions out."""
    if cfg.backend == "openvino":
        from yolo.openvino_model import OpenVinoModel
        model = OpenVinoModel(cfg.weights or None, preset=cfg.preset, precision=precision, threads=threads,
                              fuse=cfg.fuse, timing=cfg.module_timing, keep_span_forwards=cfg.trace_module_forwards)
        return model, model.timing
    model = load_model(cfg.weights or None, preset=cfg.preset, device=device, precision=precision, fuse=cfg.fuse,
                       inplace=cfg.inplace, channels_last=cfg.channels_last)
    return model, instrument_model(model, cfg, device)


class Detector:
    """The model and what a batch needs: input conversion, candidate selection, module timing."""

    def __init__(self, args: StageArgs):
        cfg = args.config
        self.device = torch.device(args.device)
        self.model = None
        self.timing = None
        self.precision = choose_precision(self.device, cfg.half)
        if cfg.preset != MODEL_FREE or cfg.weights:
            logging.getLogger("yolo.model").setLevel(logging.ERROR)  # the runner already warned of random weights
            self.model, self.timing = load_backend(cfg, self.device, self.precision, args.torch_threads)
            if self.model.max_stride != LETTERBOX_STRIDE:
                raise RuntimeError(f"expected a model of max stride {LETTERBOX_STRIDE}, got {self.model.max_stride}")
        else:
            self.precision = "none"
        self.opts: DetectOptions = cfg.detect_options()
        self.to_batch = BatchInput(self.device, self.model.input_dtype if self.model else torch.float32,
                                   cfg.batch_size)
        self.batch_size = cfg.batch_size
        self.shapes_seen: set[tuple] = set()

    def candidates(self, images: list[np.ndarray], substages: dict, measured: bool) -> tuple[list[np.ndarray], bool]:
        """Per image Tensor[K, 6] candidates as numpy, and whether this was the first forward of
        its input shape here (slow one-off set-up: excluded from statistics). On a GPU a partial
        batch runs padded to its bucket (``batch_bucket``), so new input shapes stay few."""
        rows = batch_bucket(len(images), self.batch_size) if self.device.type == "cuda" else len(images)
        shape = (rows,) + images[0].shape
        cold = shape not in self.shapes_seen
        self.shapes_seen.add(shape)
        if self.model is None:
            return [NO_CANDIDATES] * len(images), cold
        if self.timing:
            self.timing.recorder.measuring = measured and not cold
        t_start = time.perf_counter()
        with torch.inference_mode():
            x = self.to_batch(images, rows)
            t_device = time.perf_counter()
            prediction = self.model(x)[:len(images)]  # the padded rows' results are dropped
            t_forward = time.perf_counter()
            found = candidates_for_batch(prediction, self.opts)  # .cpu() here waits for the GPU
        t_end = time.perf_counter()
        if measured and not cold:
            substages["to_device"].add((t_device - t_start) * 1e3)
            substages["forward"].add((t_forward - t_device) * 1e3)
            substages["select"].add((t_end - t_forward) * 1e3)
        return [c.numpy() for c in found], cold

    def log_line(self) -> str:
        if self.model is None:
            return "no model (--preset none): every frame gets no detections at once"
        mode = self.timing.recorder.mode if self.timing else "off"
        engine = self.model.log_line() if hasattr(self.model, "log_line") else f"torch {torch.__version__}"
        return f"model on {self.device}: {self.model.num_params()} parameters, {self.precision}, {engine}, timing {mode}"


def run(args: StageArgs) -> None:
    enter_process(args)
    threads = set_thread_counts(args.torch_threads, args.opencv_threads)
    log = setup_logging(args.name, args.log_path, args.config.log_level)
    cfg = args.config
    detector = Detector(args)
    drops = DropCounter(log)
    n_pre, n_post = len(args.endpoints.pre), cfg.post_workers
    ctx = zmq.Context()
    control = Control(ctx, args, drops)
    heartbeat = Heartbeat(ctx, args)
    frames_in = Upstream(ctx, list(args.endpoints.pre), [f"pre-{i}" for i in range(n_pre)], args.identity,
                         max(1, math.ceil(cfg.batch_size * cfg.prefetch / n_pre)), args.wire, drops)
    frames_out = Downstream(ctx, args.endpoints.infer[args.index], [f"post-{i}" for i in range(n_post)],
                            args.identity, args.wire, drops)
    results_out = make_socket(ctx, zmq.PUSH, curve=args.wire.curve)
    results_out.connect(args.endpoints.collector)
    views = SlotViews(args.run_tag)
    poller = zmq.Poller()
    for socket in frames_in.sockets + [frames_out.socket, control.socket]:
        poller.register(socket, zmq.POLLIN)
    clock, slow_ms = Clock(), test_slowdown_ms("infer")
    waiting: dict[tuple, list] = collections.defaultdict(list)  # letterboxed shape -> [(t_recv, msg, image)]
    outbox: collections.deque = collections.deque()  # (header, arrays) ready for the postprocess pool
    substages = {"to_device": Samples(), "forward": Samples(), "select": Samples()}
    batches = frames = cold_forwards = 0
    cold_forward_s = 0.0  # first forwards of an input shape: set-up time left out of ms per frame, said apart
    module_times = ModuleTimes(detector.timing)
    in_hand = InHand(args.run_tag, args.name)  # the batch being run, for the runner if this dies
    log.info(detector.log_line())
    try:
        started = False
        while not control.check():
            heartbeat.tick()
            for notice in control.take_gone():
                frames_out.peer_gone(notice["name"], notice["incarnation"], notice["final"])
                frames_in.producer_gone(notice["name"], notice["final"])
            if not started and frames_out.all_peers_known():
                # Grant credit upstream only once every postprocess worker is up, so no frame is
                # read (and timed) before the whole pipeline can carry it.
                frames_in.start()
                started = True
            frames_out.send_queued()
            while outbox and frames_out.has_credit():
                header, arrays = outbox[0]
                if frames_out.send(header, arrays) is None:
                    continue  # that consumer is gone; try the others
                outbox.popleft()
                frames_in.ack(header["id"], release=header.get("release_by") == "infer")
            due = _due_batch(waiting, cfg, frames_in.all_ended())
            if due is not None and len(outbox) < cfg.batch_size:
                group, waiting[due] = _take_batch(waiting[due], cfg.batch_size, control.poison)
                if not waiting[due]:
                    del waiting[due]
                measured = all(m.header["id"] >= cfg.warmup for _, m, _ in group)
                with clock.busy() as spent:
                    in_hand.hold(*(m.header["id"] for _, m, _ in group))
                    t_start = time.perf_counter()
                    for _, m, _ in group:
                        test_crash(m.header["name"], "infer")
                    found, cold = detector.candidates([image for _, _, image in group], substages, measured)
                    burn_cpu(slow_ms * len(group))
                    t_end = time.perf_counter()
                    in_hand.hold()
                outbox.extend(_to_post(group, found, cold, t_start, t_end, args.name, len(group)))
                module_times.after_forward()
                if measured and not cold:
                    clock.add_frames(*spent, frames=len(group))
                elif cold:
                    cold_forwards, cold_forward_s = cold_forwards + 1, cold_forward_s + t_end - t_start
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
                    _receive(socket, frames_in, views, waiting, results_out, args, control.poison)
            if frames_out.socket in events:
                frames_out.handle()
            if control.socket in events:
                control.handle()
        if control.stop_reason:
            log.info("stopping: %s", control.stop_reason)
        held = sorted([m.header["id"] for items in waiting.values() for _, m, _ in items] +
                      [h["id"] for h, _ in outbox])
        send_message(results_out, worker_stats(
            args, "infer", threads, clock, frames, drops, batches=batches, precision=detector.precision,
            backend=args.config.backend if detector.model is not None else "none",
            cold_forwards=cold_forwards, cold_forward_s=cold_forward_s,
            bytes_in=frames_in.bytes_received, bytes_out=frames_out.bytes_sent,
            messages_in=frames_in.frames_received, messages_out=frames_out.frames_sent,
            substages_ms={k: v.to_dict() for k, v in substages.items()}, link="infer->post",
            timing=module_times.export(), held=held, held_by=frames_out.held_by(),
            resent=frames_out.resent_by), token=args.wire.token)
    finally:
        in_hand.close()
        heartbeat.close()
        views.close()
        frames_in.close()
        frames_out.close()
        results_out.close()
        control.close()
        ctx.term()


def _receive(socket, frames_in: Upstream, views: SlotViews, waiting: dict, results_out, args: StageArgs,
             poison: dict[int, str]) -> None:
    """A frame into the batch of its shape; failed at once when its pixels are bad or when it
    killed inference workers twice (``poison``: id -> reason; None for a suspect, run alone)."""
    msg = frames_in.receive(socket)
    if msg is None:
        return
    try:
        check_fields(msg.header, PRE_FRAME, "frame")
    except ProtocolError as exc:
        frames_in.drops.note(exc, "frames")
        frames_in.ack(msg.header["id"])
        return
    try:
        if poison.get(msg.header["id"]):  # failed as a frame whose pixels cannot be read is
            raise SlotError(poison[msg.header["id"]])
        image = views.array(msg.header["px"].get("lb"), msg.arrays)
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[0] != 3:
            raise SlotError(f"expected a uint8 3xHxW letterboxed frame, got {image.dtype} {image.shape}")
    except SlotError as exc:
        send_message(results_out, {"type": FAILED, "id": msg.header["id"], "name": msg.header["name"],
                                   "stage": "infer", "worker": args.name, "reason": str(exc),
                                   "cycle": msg.header.get("cycle"), "video": msg.header.get("video")},
                     token=args.wire.token)
        frames_in.ack(msg.header["id"], release=True)
        return
    waiting[tuple(image.shape)].append((time.perf_counter(), msg, image))


def _take_batch(items: list, size: int, suspects: dict) -> tuple[list, list]:
    """(the batch to run now, what waits): a frame a worker died holding once runs alone, so that
    if it kills this worker too, it alone is failed, not the frames batched with it."""
    group = items[:size]
    for i, (_, msg, _) in enumerate(group):
        if len(group) > 1 and msg.header["id"] in suspects:
            return [group[i]], items[:i] + items[i + 1:]
    return group, items[size:]


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


def _to_post(group: list, found: list[np.ndarray], cold: bool, t_start: float, t_end: float, worker: str,
             batch: int) -> list[tuple[dict, list]]:
    out = []
    for (t_recv, msg, _), candidates in zip(group, found):
        header = dict(msg.header)
        for key in ("type", "src"):
            header.pop(key, None)
        header["t"] = {**header["t"], "infer_recv": t_recv, "infer_start": t_start, "infer_end": t_end}
        header.update(batch=batch, infer=worker, cold=cold)
        orig = header["px"].get("orig")
        arrays = [candidates]
        if orig is not None and "inline" in orig:  # an original that travelled in the message goes on with it
            arrays.append(msg.arrays[orig["inline"]])
            header["px"] = {**header["px"], "orig": {"inline": 1}}
        header["px"] = {**header["px"], "lb": None, "cands": {"inline": 0}}
        out.append((header, arrays))
    return out


class ModuleTimes:
    """Folds the recorder's per-module times into compact summaries every FOLD_EVERY forwards,
    so an inference process's memory stays flat however long the run."""

    FOLD_EVERY = 64

    def __init__(self, timing):
        self.timing = timing
        self.modules: dict[str, Samples] = {}
        self.forward, self.residual = Samples(), Samples()
        self._since_fold = 0

    def after_forward(self) -> None:
        self._since_fold += 1
        if self.timing is not None and self._since_fold >= self.FOLD_EVERY:
            self.fold()

    def fold(self) -> None:
        self._since_fold = 0
        times, forward, residual = self.timing.recorder.take_times()
        for name, values in times.items():
            self.modules.setdefault(name, Samples()).extend(values)
        self.forward.extend(forward)
        self.residual.extend(residual)

    def export(self) -> dict | None:
        if self.timing is None:
            return None
        self.fold()
        exported = self.timing.recorder.export()
        exported["forward_ms"] = self.forward.to_dict()
        exported["residual_ms"] = self.residual.to_dict()
        for m in exported["modules"]:
            m["times_ms"] = self.modules.get(m["name"], Samples()).to_dict()
        exported["spans"] = [list(s) for s in self.timing.recorder.spans]
        return exported
