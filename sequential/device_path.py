"""``python -m yolo --data-path device``: a frame's pixels stay tensors on ``--device`` from
decode to encode. Image files are decoded there (:mod:`inputs.imageio_device`), letterboxed,
run, suppressed (NMS where the model's output lives: only the kept rows come to the host),
drawn and JPEG-encoded there, so only the encoded bytes cross back. Frames of videos and
streams are decoded on the host and uploaded once."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch

from inputs.frames import FrameReadError, FrameRef, VideoInfo
from inputs.imageio import DecodeOptions
from inputs.imageio_device import DeviceImage, read_image_device
from inputs.plans import FramePlan
from inputs.reader import ShareReader
from yolo.detect import DetectOptions, annotated_name, final_detections, save_image
from yolo.draw_device import draw_detections_device
from yolo.jpeg_device import encode_jpeg_device
from yolo.letterbox_device import download_bgr, letterbox_device, upload_bgr
from yolo.nms import select_candidates
from yolo.tensors import chw_batch_to_input

DATA_PATHS = ("host", "device")
HOST_DECODED_FRAME = "a video or stream frame: decoded on the host, uploaded once"


def default_data_path(device: torch.device) -> str:
    """``device`` on CUDA, ``host`` on a CPU."""
    return "device" if device.type == "cuda" else "host"


@dataclass(frozen=True, eq=False)
class DeviceFrame:
    """A read frame whose pixels are a tensor on the device; ``ref``, ``original_shape``,
    ``reduction`` and ``video`` as :class:`inputs.frames.Frame` has them.

    Attributes:
        decoded (DeviceImage): the RGB ``CHW`` pixels and where they were decoded.
    """

    ref: FrameRef
    decoded: DeviceImage
    video: VideoInfo | None = None
    reduction: int = 1

    @property
    def image(self) -> torch.Tensor:
        return self.decoded.image

    @property
    def original_shape(self) -> tuple[int, int]:
        return self.decoded.original_shape


class DeviceFrameReader:
    """A :class:`inputs.reader.ShareReader` of the whole plan (worker 0 of 1) whose frames come
    as :class:`DeviceFrame`: the same ``next`` contract (a frame, None when done,
    :class:`FrameReadError` naming its frame, :class:`inputs.frames.StreamError`)."""

    def __init__(self, reader: ShareReader, plan: FramePlan, device: torch.device, decode: DecodeOptions) -> None:
        self.reader, self.plan, self.device, self.decode = reader, plan, device, decode
        self.ids = plan.worker_ids(0, 1)

    def next(self) -> DeviceFrame | None:
        position = self.reader.position
        if position < len(self.ids):
            ref = self.plan.ref(self.ids[position])
            if ref.kind == "image":
                self.reader.skip()
                try:
                    return DeviceFrame(ref, read_image_device(ref.location, self.device, self.decode))
                except FrameReadError as error:
                    error.ref = ref
                    raise
        frame = self.reader.next()
        if frame is None:
            return None
        image = upload_bgr(frame.image, self.device)
        return DeviceFrame(frame.ref, DeviceImage(image, frame.original_shape, "host", HOST_DECODED_FRAME), frame.video,
                           frame.reduction)


def write_bytes(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def save_device_image(path: str, image: torch.Tensor) -> None:
    """A JPEG encoded on the device, only its bytes brought back; another extension (a
    ``.png`` source) is downloaded and written as the host path writes it."""
    if os.path.splitext(path)[1].lower() in (".jpg", ".jpeg"):
        write_bytes(path, encode_jpeg_device(image))
    else:
        save_image(path, download_bgr(image))


def device_steps(model: torch.nn.Module, frame: DeviceFrame, opts: DetectOptions, *, device: torch.device,
                 save_dir: str | None) -> tuple[torch.Tensor, list[float], tuple[int, int]]:
    """Letterbox, model, NMS, draw and save one frame on the device. Returns its detections
    (Tensor[M, 6] on the host, frame pixels), the perf_counter readings after each step but the
    save (letterbox, model, NMS, draw: the save ends at the caller's next reading), and the
    letterboxed ``(h, w)``."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    boxed, info = letterbox_device(frame.image, opts.imgsz, model.max_stride, rect=opts.rect)
    sync()
    t2 = time.perf_counter()
    prediction = model(chw_batch_to_input(boxed[None], device, model.input_dtype))
    candidates = select_candidates(prediction[0], opts.conf_thres).float()
    sync()
    t3 = time.perf_counter()
    dets = final_detections(candidates, info, opts).cpu()  # NMS where the candidates are; the kept rows cross
    t4 = time.perf_counter()
    if save_dir is not None:
        draw_detections_device(frame.image, dets, model.names)
        sync()
    t5 = time.perf_counter()
    if save_dir is not None:
        save_device_image(os.path.join(save_dir, annotated_name(frame.ref.name, frame.ref.cycle)), frame.image)
    return dets, [t2, t3, t4, t5], (boxed.shape[1], boxed.shape[2])
