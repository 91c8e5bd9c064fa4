"""Postprocess stage: NMS on the candidate rows, boxes back to original pixels, draw and save the
annotated image when this frame is one to keep (its original read from the preprocess worker's
shared-memory slot, which this stage then gives back), and send the detections to the collector.
On the device data path the frame comes finished (detections kept, image drawn and encoded by
inference, workers/device_frames.py) and this stage writes it.

A full disk stops image saving with one logged error: frames are still detected and counted."""

from __future__ import annotations

import dataclasses
import os
import time

import cv2
import numpy as np
import torch

from analysis.samples import Samples
from process.failure_log import FailureLog
from process.faults import TestFaults
from process.stage_loop import StageProcess, run_loop
from sharedmem.in_hand import InHand
from sharedmem.slots import SlotError, SlotViews
from wire.frame_header import FrameHeader
from wire.links import SlotReturns
from wire.messages import Result
from wire.wiring import StageArgs
from topology.stages import sink_role
from workers.onward import FrameStage
from workers.store import DISK_FULL, Store, run_root, store_errors, why
from yolo.coco import coco_results
from yolo.crops import crop_box, crop_paths
from yolo.detect import annotated_name, detection_records, final_detections, in_full_size
from yolo.draw import DrawOptions, draw_detections
from yolo.labels import label_lines, label_path

ROLE = "post"
JPEG_QUALITY = 95  # OpenCV's default, as imwrite uses


class Outputs:
    """Writes annotated images, label files and crops under the run's output root (a folder, or
    a store's URL: workers/store.py); a full disk or a store's refusal turns writing off for the
    rest of the run (frames are still detected and counted) with one reason."""

    def __init__(self, run_dir: str, cfg, log):
        self.store = Store(run_root(cfg.results, run_dir))
        self.save_txt, self.save_conf, self.save_crop = cfg.save_txt, cfg.save_conf, cfg.save_crop
        self.log = log
        self.error: str | None = None
        self.saved = 0

    def save_image(self, name: str, image: np.ndarray) -> bool:
        if self.error is not None:
            return False
        ext = os.path.splitext(name)[1].lower() or ".jpg"
        params = [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY] if ext in (".jpg", ".jpeg") else []
        ok, encoded = cv2.imencode(ext, image, params)
        if not ok:
            raise OSError(f"cannot encode image as {ext}: {name}")
        if self._write(f"images/{name}", encoded.data):
            self.saved += 1
            return True
        return False

    def save_finished(self, name: str, image: np.ndarray) -> bool:
        """An annotated image the device data path drew and encoded: its file's bytes, written as they are."""
        if image.dtype != np.uint8 or image.ndim != 1:
            raise SlotError(f"expected an encoded image's uint8 bytes, got {image.dtype} {image.shape}")
        if self.error is None and self._write(f"images/{name}", image.data):
            self.saved += 1
            return True
        return False

    def write_labels(self, name: str, lines: list[str]) -> None:
        if self.error is None:
            self._write(label_path(name), "".join(f"{line}\n" for line in lines).encode())

    def save_crops(self, name: str, original: np.ndarray, dets: torch.Tensor, names) -> None:
        """Each detection cut out of the undrawn frame (``dets`` in its pixels), as detect.py's
        --save-crop saves them."""
        rows = dets.tolist()
        for path, row in zip(crop_paths(name, [int(r[5]) for r in rows], names), rows):
            crop = crop_box(original, row[:4])
            if self.error is not None or crop.size == 0:
                continue
            ok, encoded = cv2.imencode(".jpg", crop, [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
            if ok:
                self._write(path, encoded.data)

    def write_crops(self, name: str, jpegs: list, dets: torch.Tensor, names) -> None:
        """Crops the device data path encoded (None: an empty crop), where :meth:`save_crops` puts them."""
        classes = [int(c) for c in dets[:, 5].tolist()]
        if len(jpegs) != len(classes):
            raise SlotError(f"expected a crop per detection ({len(classes)}), got {len(jpegs)}")
        for path, data in zip(crop_paths(name, classes, names), jpegs):
            if data is not None and self.error is None:
                self._write(path, data.data)

    def _write(self, relative: str, data) -> bool:
        """``relative`` (``images/...``, ``labels/...``, ``crops/...``) written under the root."""
        try:
            self.store.write(relative, data)
        except store_errors() as exc:
            if not self.store.is_url and getattr(exc, "errno", None) not in DISK_FULL:
                raise
            self._stop_writing(self.store.where(relative), exc)
            return False
        return True

    def _stop_writing(self, where: str, exc: BaseException) -> None:
        if self.store.is_url:  # an object's PUT is whole or absent: nothing to remove
            reason = why(exc)
        else:
            try:
                os.unlink(where)  # never leave a truncated file behind
            except OSError:
                pass
            reason = os.strerror(exc.errno)
        self.error = f"{reason} writing {where}: image and label saving stopped, detections go on"
        self.log.info("%s", self.error)  # the collector reports it once for the whole run


def postprocess(h: FrameHeader, arrays: list, views: SlotViews, opts, names, outputs: Outputs, substages: dict,
                measured: bool, draw=None) -> dict:
    """NMS, boxes back to full-size original pixels, labels, and the annotated image (drawn here,
    or, for a video frame, by the collector, which writes frames in order). A frame of the device
    data path comes with its detections final and its image drawn and encoded
    (workers/device_frames.py): only the writing is left."""
    t_start = time.perf_counter()
    on_device = h.px.get("dets") is not None
    dets = _device_detections(h, arrays, views) if on_device else _host_detections(h, arrays, views, opts)
    full = in_full_size(dets, h.reduction, h.full_shape)
    t_nms = time.perf_counter()
    records = detection_records(full, h.name, h.id, names)
    first_pass = h.cycle == 0
    if first_pass and outputs.save_txt and len(full):
        outputs.write_labels(h.name, label_lines(full, h.full_shape, outputs.save_conf))
    saved = False
    t_draw = t_nms
    orig = h.px.get("orig")
    draws_here = h.keep_image and h.release_by != sink_role()  # the collector draws a kept video frame
    crops_here = first_pass and outputs.save_crop and len(dets) > 0
    original, written_before = None, False
    if orig is not None and not on_device and (draws_here or crops_here):
        original, written_before = _own_copy(h, orig, arrays, views)
    if crops_here:
        if on_device and h.px.get("crops"):  # cut and encoded by inference
            outputs.write_crops(h.name, _crop_files(h.px["crops"], views.array(h.px["crops"]["data"], arrays)),
                                dets, names)
        elif original is not None:
            outputs.save_crops(h.name, original, dets, names)  # a reduced decode: its pixels
    to_collector = {}
    if h.keep_image and orig is not None and not draws_here:
        to_collector = dict(video=h.video_message(), px={"orig": orig}, pre=h.pre, cycle=h.cycle,
                            draw=dets.tolist())  # the collector draws and writes video frames in order
    elif on_device:
        if h.px.get("image") is not None:
            saved = outputs.save_finished(annotated_name(h.name, h.cycle), views.array(h.px["image"], arrays))
    elif draws_here and original is not None:
        if original.ndim != 3 or original.shape[:2] != h.orig_shape:
            raise SlotError(f"expected the original of shape {h.orig_shape}, got {original.shape}")
        draw_detections(original, dets, names, inplace=True, **dataclasses.asdict(draw or DrawOptions()))
        t_draw = time.perf_counter()
        saved = outputs.save_image(annotated_name(h.name, h.cycle), original)
    t_end = time.perf_counter()
    if measured and not h.cold and not written_before:
        substages["nms"].add((t_nms - t_start) * 1e3)
        if saved:
            if not on_device:  # the device path's inference drew it
                substages["draw"].add((t_draw - t_nms) * 1e3)
            substages["save"].add((t_end - t_draw) * 1e3)
    return Result(id=h.id, name=h.name, t={**h.t, "post_start": t_start, "post_end": t_end}, detections=records,
                  workers={"pre": h.pre, "infer": h.infer}, batch=h.batch, cold=h.cold,
                  image_saved=saved or (written_before and draws_here),
                  predictions=coco_results(records, names) if first_pass else [], image_error=outputs.error,
                  **to_collector).to_message()


def _own_copy(h: FrameHeader, orig: dict, arrays: list, views: SlotViews) -> tuple[np.ndarray | None, bool]:
    """(a copy of the frame's original, False), or (None, True) when its slot is no longer lent to
    it: the frame came again after a postprocess worker that had finished it (written its image
    and crops) died before its results went on, and the slot may hold another frame's pixels by
    now. The copy is made first and the stamp read after it, so a copy made while the slot was
    being reused is never taken for the frame's (a stamp never comes back to a frame it left)."""
    original = np.array(views.array(orig, arrays))  # a copy: the slot stays as it was if we die
    if not views.still_lent_to(orig, h.id):
        return None, True
    return original, False


def _crop_files(crops: dict, data: np.ndarray) -> list[np.ndarray | None]:
    """The device path's crops, sent as one array of JPEG files end to end: each file, None for an empty crop."""
    sizes = crops.get("sizes")
    if not isinstance(sizes, list) or not all(isinstance(n, int) and n >= 0 for n in sizes) or sum(sizes) != data.size:
        raise SlotError(f"expected crop sizes adding up to {data.size} bytes, got {sizes!r}")
    ends = np.cumsum(sizes).tolist()
    return [data[end - n:end] if n else None for n, end in zip(sizes, ends)]


def _host_detections(h: FrameHeader, arrays: list, views: SlotViews, opts) -> torch.Tensor:
    """NMS on the candidate rows inference sent: the detections in the decoded image's pixels."""
    candidates = views.array(h.px.get("cands"), arrays)
    if candidates.dtype != np.float32 or candidates.ndim != 2 or candidates.shape[1] != 6:
        raise SlotError(f"expected float32 candidates of shape (K, 6), got {candidates.dtype} {candidates.shape}")
    return final_detections(torch.from_numpy(candidates.copy()), h.letterbox_info(), opts)


def _device_detections(h: FrameHeader, arrays: list, views: SlotViews) -> torch.Tensor:
    """The detections the device data path's NMS kept, in the frame's pixels."""
    dets = views.array(h.px["dets"], arrays)
    if dets.dtype != np.float32 or dets.ndim != 2 or dets.shape[1] != 6:
        raise SlotError(f"expected float32 detections of shape (M, 6), got {dets.dtype} {dets.shape}")
    return torch.from_numpy(np.array(dets))


class Postprocess(FrameStage):
    """Takes each frame from inference, finishes it (:func:`postprocess`) and sends it on."""

    def __init__(self, process: StageProcess):
        args, cfg = process.args, process.args.config
        super().__init__(process, credit=cfg.prefetch)
        self.opts, self.draw, self.names = cfg.detect_options(), cfg.draw_options(), list(args.names)
        self.failures = process.own(FailureLog(process.log))
        self.returns = process.own(SlotReturns(process.ctx, args))
        self.views = process.own(SlotViews(args.run_tag))
        self.outputs = Outputs(args.run_dir, cfg, process.log)
        self.faults = TestFaults.for_role(ROLE)
        self.substages = {"nms": Samples(), "draw": Samples(), "save": Samples()}
        self.frames = 0
        self.in_hand = process.own(InHand(args.run_tag, args.name))  # the frame being finished, for the runner if this dies
        self.frames_in.start()

    def receive(self, socket) -> None:
        taken = self.take(socket, lambda header: FrameHeader.from_message(header, sent_by="infer"))
        if taken is None:
            return
        msg, h = taken
        measured = h.id >= self.args.config.warmup
        control = self.process.control
        with self.process.clock.busy() as spent:
            self.in_hand.hold(h.id)
            try:
                if control.poison.get(h.id):  # it killed postprocess workers twice: failed, not run
                    raise RuntimeError(control.poison[h.id])
                self.faults.on_frames([h.name])
                result = postprocess(h, msg.arrays, self.views, self.opts, self.names, self.outputs, self.substages,
                                     measured, self.draw)
                result["workers"][ROLE] = self.args.name
                self.onward.put(result)
            except Exception as exc:  # one bad frame must not take the stage down
                poisoned = bool(control.poison.get(h.id))
                self.failures.failed("frame %d failed in postprocess", h.id, exc_info=not poisoned)
                self.onward.failed(h.failed(ROLE, self.args.name, str(exc) if poisoned else repr(exc)))
            if h.release_by == ROLE:
                self.returns.release(h.id, h.pre, h.px)
            self.in_hand.hold()
        if measured and not h.cold:
            self.process.clock.add_frames(*spent, frames=1)
        self.frames += 1

    def finish(self) -> None:
        onward = self.onward
        onward.flush()
        self.process.tell_collector(self.process.summary(
            ROLE, self.frames, bytes_in=self.frames_in.bytes_received, bytes_out=onward.bytes_out,
            messages_in=self.frames_in.frames_received, messages_out=onward.messages_out, link=onward.link_label,
            substages_ms={k: v.to_dict() for k, v in self.substages.items()}, **onward.held(),
            images_saved=self.outputs.saved, image_error=self.outputs.error))


def run(args: StageArgs) -> None:
    process = StageProcess(args, use_torch=True)
    run_loop(process, Postprocess(process))
