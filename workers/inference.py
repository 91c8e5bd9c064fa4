"""Inference stage: the model wrapped by the TimedModule crawler; gathers frames of the same
letterboxed shape into batches, reads their pixels from the preprocess workers' shared-memory
slots, runs them on its device, and sends each frame's candidate rows (those above conf_thres,
not the raw prediction) to the postprocess pool. With ``--preset none`` there is no model: it
answers at once with no candidates, so a run measures what the pipeline itself can carry.

On the device data path (``--data-path device``) frames come undecoded and this stage decodes,
letterboxes, suppresses, draws and encodes them on its device too (workers/device_frames.py).
The model side (backend, buckets, warm-up, per-module times) is workers/detector.py."""

from __future__ import annotations

import collections
import dataclasses
import math
import time
from typing import NamedTuple

import numpy as np
import torch

from analysis.samples import Samples
from inputs.kinds import planned_frame_sizes
from process.faults import TestFaults
from process.stage_loop import POLL_TIMEOUT_MS, StageProcess, run_loop
from sharedmem.in_hand import InHand
from sharedmem.slots import SlotError, SlotViews
from wire.frame_header import FrameHeader
from wire.wiring import StageArgs
from workers.detector import Detector, ModuleTimes, out_of_memory_words
from workers.device_frames import DEVICE_SUBSTAGES, Arrived, DeviceFrames, OnDevice, check_arrived, finished_to_post
from workers.onward import FrameStage
from yolo.letterbox import LETTERBOX_STRIDE
from yolo.tensors import warm_input_shapes

ROLE = "infer"


class Waiting(NamedTuple):
    """A frame received and waiting for its batch: when it came, its header, the message's arrays,
    and its letterboxed pixels (a view of its slot; on the device data path a tensor there, with
    the frame as decoded in ``on_device``)."""

    t_recv: float
    header: FrameHeader
    arrays: list
    image: np.ndarray | torch.Tensor
    on_device: OnDevice | None = None


class Inference(FrameStage):
    """Gathers frames by letterboxed shape, runs a batch when it is full or has waited long
    enough, and sends each frame's candidates on to postprocess."""

    def __init__(self, process: StageProcess):
        args, cfg = process.args, process.args.config
        TestFaults.for_role(ROLE).delay_start()
        self.detector = Detector(args)  # first: the model loads before any socket is made
        super().__init__(process, credit=cfg.credit_per_producer())
        self.cfg = cfg
        self.views = process.own(SlotViews(args.run_tag))
        self.faults = TestFaults.for_role(ROLE)
        self.waiting: dict[tuple, list[Waiting]] = collections.defaultdict(list)  # by letterboxed shape
        self.substages = {"to_device": Samples(), "forward": Samples(), "select": Samples()}
        self.device_frames = None  # the device data path's steps (workers/device_frames.py)
        if cfg.data_path == "device":
            self.device_frames = DeviceFrames(self.detector.device, cfg, list(args.names))
            self.substages.update((step, Samples()) for step in DEVICE_SUBSTAGES)
        self.arrived: list[Arrived] = []  # device path: received, not yet decoded
        self.out_of_memory_said = False
        self.device_busy_s = 0.0  # measured batches, from the batch's start to its results on the host
        self.batches = self.frames = self.cold_forwards = 0
        self.cold_forward_s = 0.0  # first forwards of an input shape: set-up time left out of ms per frame, said apart
        self.module_times = ModuleTimes(self.detector.timing)
        self.in_hand = process.own(InHand(args.run_tag, args.name))  # the batch being run, for the runner if this dies
        self.started = False
        process.log.info(self.detector.log_line())

    def warm_input_shapes(self) -> None:
        """On a GPU, every batch bucket of every letterboxed shape the plan's frames will have."""
        if self.detector.device.type != "cuda" or self.detector.backend is None:
            return
        cfg = self.cfg
        shapes = warm_input_shapes(planned_frame_sizes(self.args.plan.items), cfg.imgsz, LETTERBOX_STRIDE, cfg.rect,
                                   cfg.batch_size)
        warmed, seconds, stopped = self.detector.warm(shapes, on_device=self.device_frames is not None)
        self.process.log.info("warmed %d input shapes in %.1f s", warmed, seconds)
        if stopped:
            self.process.log.warning("%s while warming: %d shapes left cold; a smaller --batch-size needs less",
                                     stopped, len(shapes) - warmed)

    def keep_going(self, control) -> bool:
        return not control.check()  # done() ends it, once the batches waiting are run and sent

    def step(self) -> bool:
        if not self.started and self.onward.ready():
            # Grant credit upstream only once every postprocess worker is up and the input
            # shapes are warmed, so no frame is read (and timed) before the pipeline can carry it.
            self.warm_input_shapes()
            self.frames_in.start()
            self.started = True
        self.onward.step()
        if self.arrived:
            self.prepare_arrived()
        due = _due_batch(self.waiting, self.cfg, self.frames_in.all_ended())
        if due is None or len(self.onward.outbox) >= self.cfg.batch_size:
            return False
        group, self.waiting[due] = _take_batch(self.waiting[due], self.cfg.batch_size, self.process.control.poison)
        if not self.waiting[due]:
            del self.waiting[due]
        self.run_batch(group)
        return True

    def prepare_arrived(self) -> None:
        """Device path: decode and letterbox on the device what came, into the batches' queues.
        A frame a worker died decoding (a suspect) is decoded alone, so that if it kills this
        worker too, it alone is failed; a frame that cannot be decoded fails with its reason."""
        arrived, self.arrived = self.arrived, []
        for group in decode_groups(arrived, self.process.control.poison):
            self.prepare_group(group)

    def prepare_group(self, group: list[Arrived]) -> None:
        """Decode and letterbox ``group``; on a device out of memory, each half in turn, down to
        one frame, which then fails saying so."""
        measured = all(a.header.id >= self.cfg.warmup for a in group)
        try:
            with self.process.clock.busy():
                self.in_hand.hold(*(a.header.id for a in group))
                self.faults.on_decode([a.header.name for a in group])
                prepared = self.device_frames.prepare(group, self.substages if measured else None)
        except torch.OutOfMemoryError as exc:
            self.in_hand.hold()
            self.out_of_memory(exc, f"decoding {len(group)} frames")
            if len(group) == 1:
                prepared = [(group[0], out_of_memory_words(exc, "decoding 1 frame"))]
            else:
                self.prepare_group(group[:len(group) // 2])
                self.prepare_group(group[len(group) // 2:])
                return
        self.in_hand.hold()
        for frame in prepared:
            if isinstance(frame, OnDevice):
                self.waiting[tuple(frame.boxed.shape)].append(
                    Waiting(frame.arrived.t_recv, frame.header, frame.arrived.arrays, frame.boxed, frame))
            else:
                a, reason = frame
                self.process.log.warning("frame %d (%s) failed: %s", a.header.id, a.header.name, reason)
                self.onward.failed(a.header.failed(ROLE, self.args.name, reason), release=True)

    def out_of_memory(self, exc: BaseException, running: str) -> None:
        """The device's memory ran out running something: its cache emptied, said once."""
        if self.detector.device.type == "cuda":
            torch.cuda.empty_cache()
        if not self.out_of_memory_said:
            self.out_of_memory_said = True
            self.process.log.warning("%s: running smaller batches; a smaller --batch-size (now %d) avoids this",
                                     out_of_memory_words(exc, running), self.cfg.batch_size)

    def run_batch(self, group: list[Waiting]) -> None:
        """Run ``group`` and send its frames on; on a device out of memory, each half in turn,
        down to one frame, which then fails saying so (nothing of a group is sent before it ran)."""
        try:
            self.run_and_send(group)
        except torch.OutOfMemoryError as exc:
            self.in_hand.hold()
            running = f"a batch of {len(group)} frames of {'x'.join(map(str, group[0].image.shape))}"
            self.out_of_memory(exc, running)
            if len(group) == 1:
                self.onward.failed(group[0].header.failed(ROLE, self.args.name, out_of_memory_words(exc, running)),
                                   release=True)
                return
            half = len(group) // 2
            self.run_batch(group[:half])
            self.run_batch(group[half:])

    def run_and_send(self, group: list[Waiting]) -> None:
        measured = all(item.header.id >= self.cfg.warmup for item in group)
        finished = None
        with self.process.clock.busy() as spent:
            self.in_hand.hold(*(item.header.id for item in group))
            t_start = time.perf_counter()
            self.faults.on_batch(len(group))
            found, cold = self.detector.candidates([item.image for item in group], self.substages, measured)
            if self.device_frames is not None:
                finished = self.device_frames.finish([item.on_device for item in group], found,
                                                     self.substages if measured and not cold else None)
            self.faults.on_frames([item.header.name for item in group])
            t_end = time.perf_counter()
            self.in_hand.hold()
        if finished is None:
            to_post = _to_post(group, found, cold, t_start, t_end, self.args.name, len(group))
        else:
            to_post = finished_to_post(group, finished, cold, t_start, t_end, self.args.name, len(group))
        for header, arrays in to_post:
            self.onward.put(header, arrays, release=header["release_by"] == ROLE)
        self.module_times.after_forward()
        if measured and not cold:
            self.device_busy_s += t_end - t_start
            if finished is not None:  # each frame's share of its decode and letterbox, before the batch
                spent = [spent[0] + sum(i.on_device.cost[0] for i in group),
                         spent[1] + sum(i.on_device.cost[1] for i in group)]
            self.process.clock.add_frames(*spent, frames=len(group))
        elif cold:
            self.cold_forwards, self.cold_forward_s = self.cold_forwards + 1, self.cold_forward_s + t_end - t_start
        self.batches += 1
        self.frames += len(group)

    def done(self) -> bool:
        return self.frames_in.all_ended() and not self.arrived and not self.waiting and self.onward.finished()

    def poll_timeout_ms(self) -> float:
        if self.arrived:
            return 0.0
        if len(self.onward.outbox) >= self.cfg.batch_size:  # no batch may run until postprocess takes some
            return POLL_TIMEOUT_MS
        return self.onward.poll_timeout_ms(_poll_timeout_ms(self.waiting, self.cfg))

    def receive(self, socket) -> None:
        """A frame into the batch of its shape; failed at once when its pixels are bad or when it
        killed inference workers twice (``poison``: id -> reason; None for a suspect, run alone)."""
        taken = self.take(socket, lambda header: FrameHeader.from_message(header, sent_by="pre"))
        if taken is None:
            return
        msg, header = taken
        poison = self.process.control.poison
        try:
            if poison.get(header.id):  # failed as a frame whose pixels cannot be read is
                raise SlotError(poison[header.id])
            image = self.views.array(header.px.get("lb"), msg.arrays)
            if self.device_frames is not None:
                check_arrived(image)
            elif image.dtype != np.uint8 or image.ndim != 3 or image.shape[0] != 3:
                raise SlotError(f"expected a uint8 3xHxW letterboxed frame, got {image.dtype} {image.shape}")
        except (SlotError, ValueError) as exc:
            self.onward.failed(header.failed(ROLE, self.args.name, str(exc)), release=True)
            return
        if self.device_frames is not None:
            self.arrived.append(Arrived(time.perf_counter(), header, msg.arrays, image))
            return
        self.waiting[tuple(image.shape)].append(Waiting(time.perf_counter(), header, msg.arrays, image))

    def finish(self) -> None:
        self.onward.flush()
        held = sorted([item.header.id for items in self.waiting.values() for item in items] +
                      [a.header.id for a in self.arrived] + [h["id"] for h, _, _ in self.onward.outbox])
        onward, detector = self.onward, self.detector
        self.process.tell_collector(self.process.summary(
            ROLE, self.frames, batches=self.batches, precision=detector.precision, backend=detector.backend_name,
            cold_forwards=self.cold_forwards, cold_forward_s=self.cold_forward_s,
            bytes_in=self.frames_in.bytes_received, bytes_out=onward.bytes_out,
            messages_in=self.frames_in.frames_received, messages_out=onward.messages_out,
            substages_ms={k: v.to_dict() for k, v in self.substages.items()}, link=onward.link_label,
            timing=self.module_times.export(), device_usage=self.detector.device_usage(self.device_busy_s),
            **{**onward.held(), "held": held}))


def run(args: StageArgs) -> None:
    process = StageProcess(args, use_torch=True)
    run_loop(process, Inference(process))


def decode_groups(arrived: list, suspects: dict) -> list[list]:
    """The device path's decode calls for frames received together: each frame a worker died
    holding (``suspects``) alone, the others in one call."""
    together = [a for a in arrived if a.header.id not in suspects]
    return [[a] for a in arrived if a.header.id in suspects] + ([together] if together else [])


def _take_batch(items: list[Waiting], size: int, suspects: dict) -> tuple[list[Waiting], list[Waiting]]:
    """(the batch to run now, what waits): a frame a worker died holding once runs alone, so that
    if it kills this worker too, it alone is failed, not the frames batched with it."""
    group = items[:size]
    for i, item in enumerate(group):
        if len(group) > 1 and item.header.id in suspects:
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
        if items[0].t_recv < oldest_t:
            oldest_shape, oldest_t = shape, items[0].t_recv
    if oldest_shape is not None and (inputs_ended or (now - oldest_t) * 1e3 >= cfg.max_wait_ms):
        return oldest_shape
    return None


def _poll_timeout_ms(waiting: dict, cfg) -> float:
    oldest = min((items[0].t_recv for items in waiting.values() if items), default=None)
    if oldest is None:
        return POLL_TIMEOUT_MS
    return max(0.0, min(POLL_TIMEOUT_MS, cfg.max_wait_ms - (time.perf_counter() - oldest) * 1e3))


def _to_post(group: list[Waiting], found: list[np.ndarray], cold: bool, t_start: float, t_end: float, worker: str,
             batch: int) -> list[tuple[dict, list]]:
    """Each frame of a batch as it goes to postprocess: its candidate rows in the message, its
    header told which worker and batch ran it and when."""
    out = []
    for item, candidates in zip(group, found):
        header = item.header
        orig = header.px.get("orig")
        arrays = [candidates]
        if orig is not None and "inline" in orig:  # an original that travelled in the message goes on with it
            arrays.append(item.arrays[orig["inline"]])
            orig = {"inline": 1}
        times = {**header.t, "infer_recv": item.t_recv, "infer_start": t_start, "infer_end": t_end}
        header = dataclasses.replace(header, t=times, batch=batch, infer=worker, cold=cold,
                                     px={**header.px, "orig": orig, "lb": None, "cands": {"inline": 0}})
        out.append((header.to_message(), arrays))
    return out
