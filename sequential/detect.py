"""The detection steps shared by the single-process detector and the pipeline's stages, and
the single-process detector itself: load -> letterbox -> model -> NMS -> draw -> save, one
image at a time, with the milliseconds of each stage per image."""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import cv2
import numpy as np
import torch

from yolo.boxes import scale_boxes, unreduce_boxes
from yolo.draw import draw_detections
from yolo.labels import label_lines, label_path, write_label_file
from yolo.letterbox import LetterboxInfo, letterbox
from yolo.tensors import to_tensor
from yolo.nms import nms_candidates, select_candidates
from inputs.frames import Frame, FrameReadError, StreamError
from inputs.imageio import DecodeOptions
from inputs.reader import ShareReader
from inputs.plans import FramePlan
from inputs.streams import StreamOptions, StreamStats
from yolo.timing import timed

log = logging.getLogger(__name__)

SEQUENTIAL_STAGES = ("read", "letterbox", "model", "nms", "draw", "save")


@dataclass(frozen=True)
class DetectOptions:
    """What decides which boxes come out; validated once, where the options enter."""

    imgsz: int = 640
    rect: bool = True  # minimal padding, as the pipeline's default
    conf_thres: float = 0.25
    iou_thres: float = 0.45
    classes: tuple[int, ...] | None = None
    agnostic: bool = False
    max_det: int = 1000

    def __post_init__(self) -> None:
        if self.imgsz <= 0 or self.imgsz % 32:
            raise ValueError(f"imgsz: expected a positive multiple of 32, got {self.imgsz}")
        for name in ("conf_thres", "iou_thres"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name}: expected a value in [0, 1], got {value}")
        if self.max_det <= 0:
            raise ValueError(f"max_det: expected > 0, got {self.max_det}")
        if self.classes is not None and any(c < 0 for c in self.classes):
            raise ValueError(f"classes: expected class indices >= 0, got {list(self.classes)}")


def candidates_for_batch(prediction: torch.Tensor, opts: DetectOptions) -> list[torch.Tensor]:
    """Tensor[B, N, 5 + nc] -> per image Tensor[K, 6] float32 on the CPU: the rows NMS needs."""
    return [select_candidates(p, opts.conf_thres).float().cpu() for p in prediction]


@timed("nms")
def final_detections(candidates: torch.Tensor, info: LetterboxInfo, opts: DetectOptions) -> torch.Tensor:
    """Tensor[K, 6] candidates in letterbox pixels -> Tensor[M, 6] (x1, y1, x2, y2, score, cls)
    in original-image pixels, best score first."""
    dets = nms_candidates(candidates, opts.iou_thres, opts.classes, opts.agnostic, opts.max_det)
    return torch.cat((scale_boxes(dets[:, :4], info), dets[:, 4:]), 1)


def detection_records(dets: torch.Tensor, image: str, frame: int, names: Sequence[str]) -> list[dict[str, Any]]:
    """The ``--save-json`` records of one image."""
    records = []
    for x1, y1, x2, y2, score, cls in dets.tolist():
        class_id = int(cls)
        records.append({"image": image, "frame": frame, "class_id": class_id,
                        "class": names[class_id] if class_id < len(names) else str(class_id),
                        "score": round(score, 6), "box": [round(v, 4) for v in (x1, y1, x2, y2)]})
    return records


def annotated_name(name: str, cycle: int) -> str:
    """Where an annotated frame is saved under the image folder, unique per frame: the image's
    name (a video frame's name carries its index), the pass number when the source loops, and
    the original extension kept in the stem unless it is already .jpg/.jpeg/.png."""
    video, _, index = name.rpartition(":")
    if video and index.isdigit():
        name = f"{video}_{index}"  # clip.mp4:000017 -> clip.mp4_000017, saved as a .jpg
    stem, ext = os.path.splitext(name)
    suffix = f"_pass{cycle}" if cycle else ""
    if ext.lower() in (".jpg", ".jpeg", ".png"):
        return f"{stem}{suffix}{ext}"
    return f"{name}{suffix}.jpg"


def save_image(path: str, image: np.ndarray) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    if not cv2.imwrite(path, image):
        raise OSError(f"cannot write image: {path}")


def summarise_counts(dets: torch.Tensor, names: Sequence[str]) -> str:
    if len(dets) == 0:
        return "no detections"
    classes, counts = torch.unique(dets[:, 5].int(), return_counts=True)
    parts = [f"{n} {names[c] if c < len(names) else c}{'s' if n > 1 else ''}"
             for c, n in zip(classes.tolist(), counts.tolist())]
    return ", ".join(parts)


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

    @property
    def fps(self) -> float:
        return self.frames / self.wall_s if self.wall_s > 0 else 0.0


def run_sequential(model: torch.nn.Module, plan: FramePlan, opts: DetectOptions, *, device: torch.device,
                   save_dir: str | None = None, save_txt: bool = False, save_conf: bool = False,
                   warmup: int = 0, progress: bool = True, decode: DecodeOptions | None = None,
                   streams: StreamOptions | None = None) -> SequentialResult:
    """Detect on every planned frame, one at a time. The first ``warmup`` frames run but are
    left out of the stage times and the fps. An open-ended plan (a live stream) runs until its
    streams are given up or Ctrl-C. With a reduced decode the records hold full-size boxes and
    the saved images are the reduced ones, boxes drawn at that size. With ``save_dir``, annotated
    images go there, and with ``save_txt`` YOLO label files under its ``labels/`` (first pass of
    a looped source only; ``save_conf`` adds the scores)."""
    if save_txt and save_dir is None:
        raise ValueError("save_txt: expected a save_dir for the labels/ folder, got None")
    result = SequentialResult()
    decode = decode or DecodeOptions(imgsz=opts.imgsz)
    measured_start = time.perf_counter()
    consumed = 0
    with ShareReader(plan, decode=decode, streams=streams) as reader, torch.inference_mode():
        try:
            while True:
                if consumed == warmup:
                    measured_start = time.perf_counter()
                t0 = time.perf_counter()
                try:
                    frame = reader.next()
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
                _detect_frame(model, frame, opts, consumed > warmup, t0, result, device=device, save_dir=save_dir,
                              labels=(save_txt, save_conf), progress=progress, total=plan.total)
        except KeyboardInterrupt:
            result.interrupted = True
            log.info("interrupted: stopping after %d frames", consumed)
        result.streams = reader.stream_stats()
    result.wall_s = time.perf_counter() - measured_start
    return result


def _detect_frame(model: torch.nn.Module, frame: Frame, opts: DetectOptions, measured: bool, t0: float,
                  result: SequentialResult, *, device: torch.device, save_dir: str | None,
                  labels: tuple[bool, bool], progress: bool, total: int | None) -> None:
    """Letterbox, model, NMS, draw and save one frame read at ``t0``; its records and stage
    times go into ``result``. ``labels`` is (save_txt, save_conf)."""
    names, ref = model.names, frame.ref
    dtype = model.input_dtype
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    t1 = time.perf_counter()
    boxed, info = letterbox(frame.image, opts.imgsz, model.max_stride, rect=opts.rect)
    t2 = time.perf_counter()
    prediction = model(to_tensor(boxed, device, dtype))
    candidates = candidates_for_batch(prediction, opts)[0]
    sync()
    t3 = time.perf_counter()
    dets = final_detections(candidates, info, opts)
    t4 = time.perf_counter()
    if save_dir is not None:
        draw_detections(frame.image, dets, names, inplace=True)
    t5 = time.perf_counter()
    if save_dir is not None:
        save_image(os.path.join(save_dir, annotated_name(ref.name, ref.cycle)), frame.image)
    if frame.reduction > 1:
        dets = torch.cat((unreduce_boxes(dets[:, :4], frame.reduction, frame.original_shape), dets[:, 4:]), 1)
    save_txt, save_conf = labels
    if save_txt and ref.cycle == 0 and len(dets):
        lines = label_lines(dets, frame.original_shape, save_conf)
        write_label_file(os.path.join(save_dir, label_path(ref.name)), lines)
    t6 = time.perf_counter()
    result.records.extend(detection_records(dets, ref.name, ref.frame_id, names))
    if measured:
        result.frames += 1
        for stage, ms in zip(SEQUENTIAL_STAGES, np.diff([t0, t1, t2, t3, t4, t5, t6]) * 1e3):
            result.stage_ms[stage].append(float(ms))
    if progress:
        log.info("%d/%s %s: %dx%d %s, %.1f ms", ref.frame_id + 1, total if total is not None else "?", ref.name,
                 boxed.shape[0], boxed.shape[1], summarise_counts(dets, names), (t6 - t0) * 1e3)


def write_json(path: str, records: list[dict[str, Any]]) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(records, f, indent=1)
