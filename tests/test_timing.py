"""yolo.timing: module selection, instrumentation and its removal, the @timed decorator, and
aggregation, on a tiny hand-made tree (names known by heart) and on YOLOv5."""

from __future__ import annotations

import time
from collections import OrderedDict

import numpy as np
import pytest
import torch
import torch.nn as nn

from yolo.model import YOLOv5
from yolo.timing import (RESIDUAL_NAME, Recorder, TimedModule, aggregate, forward_stats, instrument,
                         select_modules, timed)

SLEEP_S = 0.004


@timed("helper")
def _helper(x: torch.Tensor) -> torch.Tensor:
    return x * 2


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = nn.ReLU()

    def forward(self, x):
        return x + self.act(self.fc(x))


class Sleep(nn.Module):
    def forward(self, x):
        time.sleep(SLEEP_S)
        return x


class WithHelper(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        return _helper(self.fc(x))


def _tree() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(OrderedDict(stem=nn.Linear(3, 4), act=nn.ReLU(), block=Block(), head=nn.Linear(4, 2)))


LEAVES = ["stem", "act", "block.fc", "block.act", "head"]
PARAMS = {"stem": 16, "act": 0, "block": 20, "block.fc": 20, "block.act": 0, "head": 10}


def _rows(recorder: Recorder) -> dict:
    return {row.name: row for row in recorder.summary()}


def _share_sum(rows) -> float:
    return sum(r.share for r in rows if r.outermost and r.share is not None)


# -- selection -----------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, expected", [
    ({"types": [nn.Linear]}, ["stem", "block.fc", "head"]),
    ({"types": [Block, nn.ReLU]}, ["act", "block", "block.act"]),
    ({"depth": 1}, ["stem", "act", "block", "head"]),
    ({"depth": 2}, ["block.fc", "block.act"]),
    ({"depth": 3}, []),
    ({"leaves": True}, LEAVES),
    ({"depth": 1, "leaves": True}, ["stem", "act", "block", "block.fc", "block.act", "head"]),
], ids=["linear", "block-relu", "depth1", "depth2", "depth3", "leaves", "depth1-or-leaves"])
def test_select_modules(kwargs, expected):
    assert select_modules(_tree(), **kwargs) == expected


def test_select_modules_skips_containers_that_are_iterated():
    model = nn.Sequential(nn.ModuleList([nn.Linear(2, 2), nn.ReLU()]))
    assert select_modules(model, depth=1) == []
    assert select_modules(model, leaves=True) == ["0.0", "0.1"]


@pytest.mark.parametrize("kwargs, match", [({}, "at least one"), ({"depth": 0}, "depth: expected >= 1")])
def test_select_modules_bad_criteria(kwargs, match):
    with pytest.raises(ValueError, match=match):
        select_modules(_tree(), **kwargs)


# -- instrumenting -------------------------------------------------------------------------------
def test_instrument_leaves_rows():
    model = _tree()
    handle = instrument(model, leaves=True, warmup_forwards=2)
    x = torch.rand(8, 3)
    for _ in range(2 + 5):
        model(x)
    rec = handle.recorder
    assert len(rec.forward_ms) == 5
    rows = rec.summary()
    assert [r.name for r in rows] == LEAVES + [RESIDUAL_NAME]
    by_name = {r.name: r for r in rows}
    for name in LEAVES:
        row = by_name[name]
        assert row.calls == 5
        assert row.params == PARAMS[name]
        assert row.outermost
        # The aggregation matches numpy on the raw times.
        times = np.asarray(rec.times_ms[name])
        assert row.total_ms == pytest.approx(times.sum())
        assert row.p50_ms == pytest.approx(np.median(times))
        assert row.p95_ms == pytest.approx(np.percentile(times, 95))
    assert by_name["stem"].type == "Linear" and by_name["act"].type == "ReLU"
    assert by_name["stem"].input_shapes == "8x3"
    assert by_name["head"].input_shapes == "8x4"
    assert by_name[RESIDUAL_NAME].calls == 5
    assert _share_sum(rows) == pytest.approx(1.0, abs=1e-6)


def test_nested_selection_marks_inner_rows():
    model = _tree()
    handle = instrument(model, types=[Block, nn.Linear])
    for _ in range(4):
        model(torch.rand(2, 3))
    rows = _rows(handle.recorder)
    assert rows["block"].outermost and rows["stem"].outermost and rows["head"].outermost
    assert not rows["block.fc"].outermost
    assert all(rows[n].calls == 4 for n in ("stem", "block", "block.fc", "head"))
    assert rows["block.fc"].total_ms <= rows["block"].total_ms
    assert _share_sum(rows.values()) == pytest.approx(1.0, abs=1e-6)


def test_times_match_a_known_sleep():
    model = nn.Sequential(nn.Linear(2, 2), Sleep())
    handle = instrument(model, leaves=True)
    for _ in range(3):
        model(torch.rand(1, 2))
    rows = _rows(handle.recorder)
    assert rows["1"].calls == 3
    assert SLEEP_S * 1e3 <= rows["1"].p50_ms < SLEEP_S * 1e3 + 20
    assert all(f >= s for f, s in zip(handle.recorder.forward_ms, handle.recorder.times_ms["1"]))


def test_remove_restores_original_modules():
    model = _tree()
    before = dict(model.named_modules())
    keys = list(model.state_dict())
    x = torch.rand(3, 3)
    expected = model(x)
    handle = instrument(model, types=[Block, nn.Linear, nn.ReLU])
    assert isinstance(model.block, TimedModule)
    assert list(model.state_dict()) != keys  # instrumented: wrapped names ("stem.module.weight")
    torch.testing.assert_close(model(x), expected, rtol=0, atol=0)
    assert handle.remove() is model
    after = dict(model.named_modules())
    assert list(after) == list(before)
    assert all(after[name] is before[name] for name in before)
    assert list(model.state_dict()) == keys
    assert not any(isinstance(m, TimedModule) for m in model.modules())
    calls = len(handle.recorder.forward_ms)
    assert torch.equal(model(x), expected)
    assert len(handle.recorder.forward_ms) == calls  # hooks are gone too


def test_instrumenting_twice_raises():
    model = _tree()
    instrument(model, leaves=True)
    with pytest.raises(RuntimeError, match="already instrumented"):
        instrument(model, depth=1)


def test_instrumenting_twice_by_names_raises():
    model = _tree()
    instrument(model, leaves=True)
    with pytest.raises(RuntimeError, match="already instrumented"):
        instrument(model, names=["stem"])


def test_instrument_unknown_name():
    with pytest.raises(ValueError, match="'nope'"):
        instrument(_tree(), names=["stem", "nope"])


# -- @timed and the recorder's switches ----------------------------------------------------------
def test_timed_records_inside_forward():
    model = WithHelper()
    handle = instrument(model, leaves=True)
    for _ in range(3):
        model(torch.rand(2, 3))
    rows = _rows(handle.recorder)
    assert rows["helper"].calls == 3 and rows["helper"].type == "function"
    assert rows["helper"].input_shapes == "2x3"
    assert rows["helper"].share is not None


def test_timed_via_activate_and_noop_otherwise():
    rec = Recorder()
    x = torch.ones(2)
    assert torch.equal(_helper(x), x * 2)  # no active recorder: plain call
    assert rec.times_ms == {}
    with rec.activate():
        _helper(x)
        _helper(x)
    _helper(x)
    assert len(rec.times_ms["helper"]) == 2
    rows = _rows(rec)
    assert rows["helper"].calls == 2
    assert rows["helper"].share is None  # timed outside any forward


def test_paused_excludes_forwards():
    model = _tree()
    handle = instrument(model, leaves=True)
    rec = handle.recorder
    model(torch.rand(1, 3))
    with rec.paused():
        for _ in range(3):
            model(torch.rand(1, 3))
    assert rec.measuring
    model(torch.rand(1, 3))
    assert len(rec.forward_ms) == 2
    assert all(len(t) == 2 for t in rec.times_ms.values())


def test_aggregate_merges_exports():
    exports = []
    for forwards in (2, 3):
        model = _tree()
        handle = instrument(model, leaves=True)
        for _ in range(forwards):
            model(torch.rand(1, 3))
        exports.append(handle.recorder.export())
    rows = {r.name: r for r in aggregate(exports)}
    assert rows["stem"].calls == 5 and rows[RESIDUAL_NAME].calls == 5
    total = sum(r.total_ms for r in rows.values() if r.outermost)
    assert forward_stats(exports)["forwards"] == 5
    assert forward_stats(exports)["timing_mode"] == "cpu"  # the report says which clock timed the modules
    assert total == pytest.approx(forward_stats(exports)["total_ms"], rel=1e-6)
    assert _share_sum(rows.values()) == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("mode, error", [("bogus", ValueError), ("cuda-sync", RuntimeError),
                                         ("cuda-events", RuntimeError)])
def test_recorder_modes_refused(mode, error):
    if mode.startswith("cuda") and torch.cuda.is_available():
        pytest.skip("CUDA is available: cuda timing modes are valid here")
    with pytest.raises(error, match=mode):
        Recorder(mode)


# -- YOLOv5 --------------------------------------------------------------------------------------
def test_yolov5_depth2_layers_and_decode_row():
    model = YOLOv5.from_preset("yolov5n").eval()
    handle = instrument(model, depth=2, warmup_forwards=1)
    with torch.no_grad():
        for _ in range(3):
            y = model(torch.rand(1, 3, 256, 256))
    assert y.shape == (1, 3 * (32 * 32 + 16 * 16 + 8 * 8), 85)
    rows = handle.recorder.summary()
    names = [r.name for r in rows]
    layers = [f"model.{i}" for i in range(25)]
    assert names[:25] == layers
    assert set(names[25:]) == {"Detect.decode", RESIDUAL_NAME}
    by_name = {r.name: r for r in rows}
    assert all(by_name[n].calls == 2 for n in names)
    assert by_name["model.24"].type == "Detect"
    assert not by_name["Detect.decode"].outermost  # called inside model.24
    assert sum(r.params for r in rows if r.name in layers) == model.num_params()
    assert _share_sum(rows) == pytest.approx(1.0, abs=1e-6)
    handle.remove()
    assert not any(isinstance(m, TimedModule) for m in model.modules())


# -- CUDA ----------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="cuda timing modes are tested on CUDA only (no GPU)")
@pytest.mark.parametrize("mode", ["cuda-sync", "cuda-events"])
def test_cuda_modes(mode):
    model = YOLOv5.from_preset("yolov5n").eval().fuse().cuda()
    handle = instrument(model, depth=2, mode=mode, warmup_forwards=1)
    with torch.no_grad():
        for _ in range(4):
            model(torch.rand(1, 3, 256, 256, device="cuda"))
    torch.cuda.synchronize()
    rows = handle.recorder.summary()
    by_name = {r.name: r for r in rows}
    assert all(by_name[f"model.{i}"].calls == 3 for i in range(25))
    assert all(r.total_ms > 0 for r in rows if r.name != RESIDUAL_NAME)
    assert _share_sum(rows) == pytest.approx(1.0, abs=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="cuda timing modes are tested on CUDA only (no GPU)")
def test_default_mode_on_cuda_is_events():
    model = nn.Linear(2, 2).cuda()
    assert instrument(model, leaves=True).recorder.mode == "cuda-events"
