"""The stages' pure parts, without processes or sockets: when inference runs a batch, what a frame
looks like on each link (preprocess -> inference -> postprocess), and postprocess mapping
boxes back to the full-size frame."""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

import numpy as np
import pytest

from inputs.frames import Frame, FrameRef, VideoInfo
from settings.config import build_config
from wire.frame_header import FrameHeader
from workers.inference import Waiting, _due_batch, _poll_timeout_ms, _to_post
from workers.postprocess import Outputs, postprocess
from workers.preprocess import FramesOut, prepare
from sharedmem.slots import SlotViews

CFG = build_config({}, {"batch_size": 4, "max_wait_ms": 50.0, "imgsz": 64, "save_images": "all"})


def waiting_frame(t_recv: float, shape=(3, 64, 64), frame_id: int = 0) -> Waiting:
    header = FrameHeader(id=frame_id, name=f"f{frame_id}.jpg", cycle=0, ratio=1.0, pad=(0.0, 0.0),
                         orig_shape=(64, 64), lb_shape=shape[1:], full_shape=(64, 64), reduction=1, keep_image=False,
                         pre="pre-0", release_by="infer", t={"read_start": t_recv}, px={"lb": {"inline": 0}})
    return Waiting(t_recv, header, [], np.zeros(shape, np.uint8))


def test_a_full_batch_runs_at_once_and_a_partial_one_after_max_wait_or_when_input_ends():
    now = time.perf_counter()
    fresh = {(3, 64, 64): [waiting_frame(now, frame_id=i) for i in range(2)]}
    assert _due_batch(fresh, CFG, inputs_ended=False) is None  # 2 of 4, waited less than 50 ms
    assert _due_batch(fresh, CFG, inputs_ended=True) == (3, 64, 64)
    assert 0 < _poll_timeout_ms(fresh, CFG) <= 50.0
    full = {(3, 64, 32): [waiting_frame(now, (3, 64, 32), i) for i in range(4)], **fresh}
    assert _due_batch(full, CFG, inputs_ended=False) == (3, 64, 32)
    stale = {(3, 64, 64): [waiting_frame(now - 1.0)], (3, 32, 64): [waiting_frame(now - 2.0, (3, 32, 64))]}
    assert _due_batch(stale, CFG, inputs_ended=False) == (3, 32, 64)  # the oldest shape first
    assert _poll_timeout_ms(stale, CFG) == 0.0 and _due_batch({}, CFG, inputs_ended=True) is None


def synthetic_frame(reduction: int = 1, video: bool = False) -> Frame:
    ref = FrameRef(frame_id=5, kind="video" if video else "image", name="clip.mp4:000006" if video else "a.jpg",
                   item=2, index=5, cycle=0, location="/x", source_index=5)
    image = np.full((48 // reduction, 80 // reduction, 3), 127, np.uint8)
    info = VideoInfo(fps=25.0, width=80, height=48, frames=9, source_fps=25.0, vid_stride=1) if video else None
    return Frame(ref, image, original_shape=(48, 80), reduction=reduction, video=info)


@pytest.mark.parametrize("video", [False, True])
def test_a_prepared_frame_carries_its_geometry_and_place_to_inference(video):
    header, arrays = prepare(synthetic_frame(video=video), time.perf_counter(), CFG, True, "pre-1", "post")
    message, inline = FramesOut(SimpleNamespace(slot_bytes=0)).pack(header, arrays)  # no ring: arrays in the message
    received = FrameHeader.from_message({**message, "type": "frame", "src": "pre-1.0"}, sent_by="pre")
    assert received == header.__class__(**{**header.__dict__, "px": {"lb": {"inline": 0}, "orig": {"inline": 1}}})
    assert received.lb_shape == (64, 64) and received.ratio == pytest.approx(0.8) and received.pad == (0.0, 13.0)
    assert inline[0].shape == (3, 64, 64) and inline[1].shape == (48, 80, 3)
    assert (received.video is not None) == video and (not video or received.video.index == 5)


def test_a_frame_leaves_inference_with_its_candidates_and_an_original_that_travelled_inline():
    now = time.perf_counter()
    item = waiting_frame(now, frame_id=3)
    original = np.zeros((64, 64, 3), np.uint8)
    item = item._replace(header=FrameHeader(**{**item.header.__dict__, "px": {"lb": {"inline": 0},
                                                                                 "orig": {"inline": 1}}}),
                         arrays=[item.image, original])
    candidates = np.zeros((2, 6), np.float32)
    (message, arrays), = _to_post([item], [candidates], cold=True, t_start=now + 1, t_end=now + 2, worker="infer-0",
                                  batch=1)
    header = FrameHeader.from_message(message, sent_by="infer")
    assert header.px == {"lb": None, "orig": {"inline": 1}, "cands": {"inline": 0}}
    assert arrays[0] is candidates and arrays[1] is original
    assert header.infer == "infer-0" and header.cold and header.t["infer_end"] - header.t["infer_recv"] == 2.0


def test_postprocess_maps_boxes_of_a_reduced_decode_to_the_full_frame_and_saves_its_image(tmp_path):
    cfg = build_config({}, {"imgsz": 64, "save_images": "all", "save_txt": True})
    header, arrays = prepare(synthetic_frame(reduction=2), time.perf_counter(), cfg, True, "pre-0", "post")
    # one candidate in letterbox pixels (ratio 1.6 for the 40x24 reduced image; its top border round(12.8 - 0.1))
    candidates = np.array([[16.0, 29.0, 48.0, 45.0, 0.9, 0.0]], np.float32)
    header = FrameHeader(**{**header.__dict__, "infer": "infer-0", "batch": 1,
                            "px": {"lb": None, "orig": {"inline": 1}, "cands": {"inline": 0}}})
    outputs = Outputs(str(tmp_path), cfg, logging.getLogger("test"))
    substages = {"nms": [], "draw": [], "save": []}
    substages = {k: SimpleNamespace(add=v.append) for k, v in substages.items()}
    result = postprocess(header, [candidates, arrays[1]], SlotViews("test"), cfg.detect_options(), ["person"], outputs,
                         substages, measured=True)
    (record,) = result["detections"]
    # letterbox -> reduced image: x / 1.6, (y - 13) / 1.6 = (10, 10, 30, 20); full size: x 2
    assert record["box"] == pytest.approx([20.0, 20.0, 60.0, 40.0], abs=1e-3)
    assert result["image_saved"] and (tmp_path / "images" / "a.jpg").is_file()
    assert (tmp_path / "labels" / "a.txt").read_text().startswith("0 0.5 0.625 0.5 0.416")
