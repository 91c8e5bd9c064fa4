"""The device data path's steps in an inference process (``--data-path device``): a frame's pixels
stay torch tensors on the inference worker's device from decode to encode.

Preprocess hands on an image file's bytes undecoded (a video or stream frame, or a synthetic
scene, as host-decoded BGR pixels). Here, per batch of frames received: the JPEGs are decoded on
the device in one call (nvJPEG on CUDA; a frame the device decoder refuses is decoded on the host
and uploaded, :mod:`inputs.imageio_device`), host pixels uploaded, each frame letterboxed there
(OpenCV-exact, :mod:`yolo.letterbox_device`). After the forward: NMS where the candidates are
(only the kept rows come to the host), and for a frame whose image is saved, crops cut and the
boxes drawn on the device tensor and the result JPEG-encoded there, so postprocess receives the
detections and encoded bytes only and writes them. A kept video frame is drawn by the collector
as on the host path (it writes a video's frames in order from the preprocess slot).

The steps are timed as the inference stage's substages (decode, letterbox, nms, draw, encode),
beside the backend's (to_device, forward, select), so the report keeps a row per step.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass

import cv2
import numpy as np
import torch

from inputs.frames import FrameReadError
from inputs.imageio import DecodeOptions
from inputs.imageio_device import DeviceImage, decode_images_device
from wire.frame_header import FrameHeader
from yolo.detect import DetectOptions, annotated_name, final_detections
from yolo.devices import synchronizer
from yolo.draw_device import draw_detections_device
from yolo.jpeg_device import crop_jpegs_device, encode_jpegs_device
from yolo.letterbox import LETTERBOX_STRIDE
from yolo.letterbox_device import download_bgr, letterbox_device, upload_bgr

DEVICE_SUBSTAGES = ("decode", "letterbox", "nms", "draw", "encode")
JPEG_NAMES = (".jpg", ".jpeg")


@dataclass(frozen=True, eq=False)
class Arrived:
    """A frame as preprocess sent it: its header, the message's arrays, and what the slot holds
    (``uint8`` file bytes, 1-D; or BGR pixels ``[H, W, 3]``)."""

    t_recv: float
    header: FrameHeader
    arrays: list
    data: np.ndarray


@dataclass(frozen=True, eq=False)
class OnDevice:
    """A frame decoded and letterboxed on the device; ``header`` has its geometry now."""

    arrived: Arrived
    header: FrameHeader
    boxed: torch.Tensor  # uint8 [3, h, w], the model's input
    original: torch.Tensor  # uint8 RGB [3, H, W], drawn on when its image is saved
    cost: tuple[float, float]  # (wall_s, cpu_s) of its share of decode and letterbox


@dataclass(frozen=True)
class Finished:
    """What crosses to postprocess for one frame: the kept detections in its pixels, and (when
    its image is saved) the annotated image file's bytes, and each detection's crop as JPEG
    bytes (None: an empty crop)."""

    detections: np.ndarray  # float32 [M, 6]
    image: np.ndarray | None = None  # uint8 file bytes (1-D)
    crops: tuple = ()


def is_encoded(data: np.ndarray) -> bool:
    """A slot's array that holds a file's bytes rather than pixels."""
    return data.ndim == 1


def check_arrived(data: np.ndarray) -> None:
    if data.dtype != np.uint8 or not (data.ndim == 1 or (data.ndim == 3 and data.shape[2] == 3)):
        raise ValueError(f"expected a frame's uint8 file bytes or BGR HxWx3 pixels, got {data.dtype} {data.shape}")


class DeviceFrames:
    """The device steps of one inference process, on ``device``."""

    def __init__(self, device: torch.device, cfg, names: list[str]):
        self.device = torch.device(device)
        self.opts: DetectOptions = cfg.detect_options()
        self.draw = cfg.draw_options()
        self.decode_options = DecodeOptions("full", cfg.imgsz, cfg.max_pixels)
        self.names = names
        self.save_crop = cfg.save_crop
        self.sync = synchronizer(self.device)

    def prepare(self, arrived: list[Arrived], substages: dict | None) -> list[OnDevice | tuple[Arrived, str]]:
        """Decode (the file bytes in one call) or upload each frame, and letterbox it; per frame
        in order, the frame on the device or ``(arrived, why it failed)``. ``substages`` None:
        not measured."""
        t0, c0 = time.perf_counter(), time.process_time()
        encoded = [a for a in arrived if is_encoded(a.data)]
        decoded = dict(zip(map(id, encoded), decode_images_device(
            [a.data for a in encoded], self.device, self.decode_options, [a.header.name for a in encoded])))
        images = {}
        for a in arrived:
            images[id(a)] = decoded[id(a)] if id(a) in decoded else upload_bgr(a.data, self.device)
        self.sync()
        t1 = time.perf_counter()
        out: list[OnDevice | tuple[Arrived, str]] = []
        for a in arrived:
            image = images[id(a)]
            if isinstance(image, FrameReadError):
                out.append((a, image.reason))
                continue
            if isinstance(image, DeviceImage):
                image = image.image
            boxed, info = letterbox_device(image, self.opts.imgsz, LETTERBOX_STRIDE, rect=self.opts.rect)
            shape = (int(image.shape[1]), int(image.shape[2]))
            header = _with_geometry(a.header, info, shape)
            out.append(OnDevice(a, header, boxed, image, (0.0, 0.0)))
        self.sync()
        t2, c2 = time.perf_counter(), time.process_time()
        ready = [frame for frame in out if isinstance(frame, OnDevice)]
        if ready:
            share = ((t2 - t0) / len(ready), (c2 - c0) / len(ready))
            out = [OnDevice(f.arrived, f.header, f.boxed, f.original, share) if isinstance(f, OnDevice) else f
                   for f in out]
            if substages is not None:
                substages["decode"].add((t1 - t0) * 1e3 / len(ready))
                substages["letterbox"].add((t2 - t1) * 1e3 / len(ready))
        return out

    def finish(self, frames: list[OnDevice], candidates: list[torch.Tensor], substages: dict | None
               ) -> list[Finished]:
        """NMS on the device per frame; for frames whose image is saved, crops (videos' too), and
        for those not of a video (the collector writes those) the boxes drawn on a copy and one
        JPEG encode call. Nothing of ``frames`` is changed, so a call that fails (the device out of
        memory) can be made again on them. ``substages`` None: not measured."""
        t0 = time.perf_counter()
        kept = [final_detections(c, f.header.letterbox_info(), self.opts) for f, c in zip(frames, candidates)]
        rows = [k.cpu().numpy().astype(np.float32, copy=False) for k in kept]  # only the kept rows cross
        t1 = time.perf_counter()
        crops = {i: tuple(crop_jpegs_device(f.original, rows[i])) for i, f in enumerate(frames)
                 if self.save_crop and f.header.keep_image and f.header.cycle == 0 and len(rows[i])}
        drawn = {i: frames[i].original.clone() for i, f in enumerate(frames)
                 if f.header.keep_image and f.header.video is None}
        for i, canvas in drawn.items():
            draw_detections_device(canvas, rows[i], self.names, self.draw.line_width, self.draw.hide_labels,
                                   self.draw.hide_conf)
        self.sync()
        t2 = time.perf_counter()
        jpegs = [i for i in drawn if _saved_as_jpeg(frames[i].header)]
        images = dict(zip(jpegs, (np.frombuffer(b, np.uint8) for b in encode_jpegs_device([drawn[i] for i in jpegs]))))
        for i in drawn:
            if i not in images:  # another extension (a .png source) is kept: encoded on the host, as there
                images[i] = _encoded_on_host(frames[i].header, drawn[i])
        t3 = time.perf_counter()
        if substages is not None and frames:
            substages["nms"].add((t1 - t0) * 1e3 / len(frames))
            if drawn:
                substages["draw"].add((t2 - t1) * 1e3 / len(drawn))
                substages["encode"].add((t3 - t2) * 1e3 / len(drawn))
        return [Finished(rows[i], images.get(i), crops.get(i, ())) for i in range(len(frames))]


def finished_to_post(group: list, finished: list[Finished], cold: bool, t_start: float, t_end: float,
                     worker: str, batch: int) -> list[tuple[dict, list]]:
    """The device path's frames as they go to postprocess (``group``: the inference stage's
    waiting frames, each with its header, arrays and receive time): the kept detections, the
    encoded image and crops in the message (a kept video frame's original stays in its slot, for
    the collector)."""
    out = []
    for item, done in zip(group, finished):
        header = item.header
        arrays = [done.detections]
        px = {"lb": None, "cands": None, "dets": {"inline": 0}, "image": None, "crops": None, "orig": None}
        orig = header.px.get("orig")
        if orig is not None and "inline" in orig:  # no slot: the original travelled in the message
            arrays.append(item.arrays[orig["inline"]])
            orig = {"inline": len(arrays) - 1}
        px["orig"] = orig
        if done.image is not None:
            arrays.append(done.image)
            px["image"] = {"inline": len(arrays) - 1}
        if done.crops:  # one array for them all: a message has a few parts only
            sizes = [0 if crop is None else len(crop) for crop in done.crops]
            arrays.append(np.frombuffer(b"".join(crop or b"" for crop in done.crops), np.uint8))
            px["crops"] = {"data": {"inline": len(arrays) - 1}, "sizes": sizes}
        times = {**header.t, "infer_recv": item.t_recv, "infer_start": t_start, "infer_end": t_end}
        header = dataclasses.replace(header, t=times, batch=batch, infer=worker, cold=cold, px=px)
        out.append((header.to_message(), arrays))
    return out


def _encoded_on_host(header: FrameHeader, image: torch.Tensor) -> np.ndarray:
    """A drawn image whose file is not a JPEG, downloaded and encoded by its extension as the host
    path's postprocess does: only a file's bytes go in the message (pixels could pass its limit)."""
    extension = os.path.splitext(annotated_name(header.name, header.cycle))[1].lower() or ".jpg"
    ok, encoded = cv2.imencode(extension, download_bgr(image))
    if not ok:
        raise OSError(f"cannot encode image as {extension}: {header.name}")
    return encoded.reshape(-1)


def _saved_as_jpeg(header: FrameHeader) -> bool:
    return os.path.splitext(annotated_name(header.name, header.cycle))[1].lower() in JPEG_NAMES


def _with_geometry(header: FrameHeader, info, shape: tuple[int, int]) -> FrameHeader:
    """The header as preprocess makes it on the host path, now that the frame is decoded."""
    return dataclasses.replace(header, ratio=info.ratio, pad=tuple(info.pad), orig_shape=tuple(info.original_shape),
                               lb_shape=tuple(info.shape), full_shape=shape, reduction=1)
