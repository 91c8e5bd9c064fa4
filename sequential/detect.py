"""The single-process detector: load -> letterbox -> model -> NMS -> draw -> save, one image at a
time, with the milliseconds of each stage per image (the detection steps are yolo.detect's, the
pipeline's too), on the host data path or the device one (sequential/device_path.py)."""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from yolo.detect import (DetectOptions, annotated_name, candidates_for_batch, detection_records, final_detections,
                         in_full_size, save_image, summarise_counts)
from yolo.draw import draw_detections
from yolo.labels import label_lines, label_path, write_label_file
from yolo.letterbox import letterbox
from yolo.tensors import to_tensor
from inputs.frames import Frame, FrameReadError, StreamError
from inputs.imageio import DecodeOptions
from inputs.reader import ShareReader
from inputs.plans import FramePlan
from inputs.streams import StreamOptions, StreamStats
from sequential.device_path import DATA_PATHS, DeviceFrame, DeviceFrameReader, device_steps

log = logging.getLogger(__name__)

SEQUENTIAL_STAGES = ("read", "letterbox", "model", "nms", "draw", "save")


@dataclass
class SequentialResult:
    frames: int = 0
    failed: list[dict[str, Any]] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    stage_ms: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in SEQUENTIAL_STAGES})
    wall_s: float = 0.0
    streams: list[StreamStats] = field(default_factory=list)
    given_up: list[str] = field(default_factory=list)  # video URLs and live streams that failed for good
    interrupted: bool = False
    data_path: str = "host"  # "device": pixels kept as tensors on the device (sequential.device_path)
    host_decoded: list[dict[str, Any]] = field(default_factory=list)  # image files the device decoder refused

    @property
    def fps(self) -> float:
        return self.frames / self.wall_s if self.wall_s > 0 else 0.0


def run_sequential(model: torch.nn.Module, plan: FramePlan, opts: DetectOptions, *, device: torch.device,
                   save_dir: str | None = None, save_txt: bool = False, save_conf: bool = False,
                   warmup: int = 0, progress: bool = True, decode: DecodeOptions | None = None,
                   streams: StreamOptions | None = None, data_path: str = "host") -> SequentialResult:
    """Detect on every planned frame, one at a time. The first ``warmup`` frames run but are
    left out of the stage times and the fps. An open-ended plan (a live stream) runs until its
    streams are given up or Ctrl-C. With a reduced decode the records hold full-size boxes and
    the saved images are the reduced ones, boxes drawn at that size. With ``save_dir``, annotated
    images go there, and with ``save_txt`` YOLO label files under its ``labels/`` (first pass of
    a looped source only; ``save_conf`` adds the scores). ``data_path`` ``"device"`` keeps the
    pixels as tensors on ``device`` (:mod:`sequential.device_path`)."""
    if save_txt and save_dir is None:
        raise ValueError("save_txt: expected a save_dir for the labels/ folder, got None")
    if data_path not in DATA_PATHS:
        raise ValueError(f"data_path: expected one of {DATA_PATHS}, got {data_path!r}")
    result = SequentialResult(data_path=data_path)
    decode = decode or DecodeOptions(imgsz=opts.imgsz)
    measured_start = time.perf_counter()
    consumed = 0
    with ShareReader(plan, decode=decode, streams=streams) as reader, torch.inference_mode():
        frames = DeviceFrameReader(reader, plan, device, decode) if data_path == "device" else reader
        try:
            while True:
                if consumed == warmup:
                    measured_start = time.perf_counter()
                t0 = time.perf_counter()
                try:
                    frame = frames.next()
                except FrameReadError as exc:
                    consumed += 1
                    result.failed.append({"frame": exc.ref.frame_id, "image": exc.ref.name, "stage": "read",
                                          "reason": exc.reason})
                    log.warning("frame %d (%s) failed: %s", exc.ref.frame_id, exc.ref.name, exc.reason)
                    continue
                except StreamError as exc:
                    result.given_up.append(str(exc))
                    log.error("%s", exc)
                    continue
                if frame is None:
                    break
                consumed += 1
                if isinstance(frame, DeviceFrame) and frame.ref.kind == "image" and frame.decoded.decoded_on == "host":
                    result.host_decoded.append({"frame": frame.ref.frame_id, "image": frame.ref.name,
                                                "reason": frame.decoded.reason})
                _detect_frame(model, frame, opts, consumed > warmup, t0, result, device=device, save_dir=save_dir,
                              labels=(save_txt, save_conf), progress=progress, total=plan.total)
        except KeyboardInterrupt:
            result.interrupted = True
            log.info("interrupted: stopping after %d frames", consumed)
        result.streams = reader.stream_stats()
    result.wall_s = time.perf_counter() - measured_start
    return result


def _detect_frame(model: torch.nn.Module, frame: Frame | DeviceFrame, opts: DetectOptions, measured: bool, t0: float,
                  result: SequentialResult, *, device: torch.device, save_dir: str | None,
                  labels: tuple[bool, bool], progress: bool, total: int | None) -> None:
    """Letterbox, model, NMS, draw and save one frame read at ``t0``, on the result's data path;
    its records and stage times go into ``result``. ``labels`` is (save_txt, save_conf)."""
    names, ref = model.names, frame.ref
    steps = device_steps if result.data_path == "device" else _host_steps
    if device.type == "cuda":
        torch.cuda.synchronize()  # the read stage ends when its decode or upload has
    t1 = time.perf_counter()
    dets, stamps, shape = steps(model, frame, opts, device=device, save_dir=save_dir)
    dets = in_full_size(dets, frame.reduction, frame.original_shape)
    save_txt, save_conf = labels
    if save_txt and ref.cycle == 0 and len(dets):
        lines = label_lines(dets, frame.original_shape, save_conf)
        write_label_file(os.path.join(save_dir, label_path(ref.name)), lines)
    t6 = time.perf_counter()
    result.records.extend(detection_records(dets, ref.name, ref.frame_id, names))
    if measured:
        result.frames += 1
        for stage, ms in zip(SEQUENTIAL_STAGES, np.diff([t0, t1, *stamps, t6]) * 1e3):
            result.stage_ms[stage].append(float(ms))
    if progress:
        log.info("%d/%s %s: %dx%d %s, %.1f ms", ref.frame_id + 1, total if total is not None else "?", ref.name,
                 shape[0], shape[1], summarise_counts(dets, names), (t6 - t0) * 1e3)


def _host_steps(model: torch.nn.Module, frame: Frame, opts: DetectOptions, *, device: torch.device,
                save_dir: str | None) -> tuple[torch.Tensor, list[float], tuple[int, int]]:
    """The host data path's steps of one frame (see :func:`sequential.device_path.device_steps`)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    boxed, info = letterbox(frame.image, opts.imgsz, model.max_stride, rect=opts.rect)
    t2 = time.perf_counter()
    prediction = model(to_tensor(boxed, device, model.input_dtype))
    candidates = candidates_for_batch(prediction, opts)[0]
    sync()
    t3 = time.perf_counter()
    dets = final_detections(candidates, info, opts)
    t4 = time.perf_counter()
    if save_dir is not None:
        draw_detections(frame.image, dets, model.names, inplace=True)
    t5 = time.perf_counter()
    if save_dir is not None:
        save_image(os.path.join(save_dir, annotated_name(frame.ref.name, frame.ref.cycle)), frame.image)
    return dets, [t2, t3, t4, t5], (boxed.shape[0], boxed.shape[1])


def write_json(path: str, records: list[dict[str, Any]]) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(records, f, indent=1)
