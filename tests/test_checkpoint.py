"""yolo.checkpoint: the real Ultralytics checkpoint loads; files that ask the unpickler to call
something are refused without running it; project state files round-trip."""

from __future__ import annotations

import builtins
import os
import pickle
import subprocess

import pytest
import torch

from yolo.checkpoint import CheckpointError, load_model, read_checkpoint, save_state
from yolo.model import YOLOv5


# -- the real checkpoint -------------------------------------------------------------------------
def test_real_checkpoint_reads(yolov5n_path):
    ckpt = read_checkpoint(yolov5n_path)
    assert ckpt.source == "ultralytics"
    assert ckpt.names[0] == "person" and len(ckpt.names) == 80
    assert ckpt.config.nc == 80
    assert ckpt.stride == [8.0, 16.0, 32.0]
    assert (ckpt.config.depth_multiple, ckpt.config.width_multiple) == (0.33, 0.25)


def test_real_checkpoint_builds(yolov5n):
    assert yolov5n.names[0] == "person"
    assert yolov5n.cfg.nc == 80
    assert yolov5n.stride.tolist() == [8.0, 16.0, 32.0]
    assert yolov5n.fused and not yolov5n.training
    assert all(not p.requires_grad for p in yolov5n.parameters())


# -- malicious pickles ---------------------------------------------------------------------------
class _System:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


class _Eval:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return builtins.eval, (f"open({str(self.marker)!r}, 'w').close()",)


class _Subprocess:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return subprocess.call, (["touch", str(self.marker)],)


# torch.save pickles with protocol 2, which writes Python 2 module names (os -> posix,
# builtins -> __builtin__, subprocess -> commands); torch reports the global under those names.
@pytest.mark.parametrize("payload, global_name", [
    (_System, "system'"), (_Eval, "eval'"), (_Subprocess, "call'"),
], ids=["os.system", "builtins.eval", "subprocess.call"])
@pytest.mark.parametrize("where", ["model", "top"])
def test_malicious_checkpoint_is_refused_unexecuted(tmp_path, payload, global_name, where):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    evil = payload(marker)
    torch.save({"model": evil, "epoch": 3} if where == "model" else evil, path)

    with pytest.raises(CheckpointError, match="global") as info:
        read_checkpoint(path)
    assert global_name in str(info.value)
    assert "was not executed" in str(info.value)
    assert not marker.exists()
    with pytest.raises(CheckpointError):
        load_model(path)
    assert not marker.exists()

    # The payload is live: an unrestricted load runs it. This proves the test is meaningful.
    torch.load(path, weights_only=False)
    assert marker.exists()


def test_non_dict_checkpoint_is_refused(tmp_path):
    path = tmp_path / "list.pt"
    torch.save([torch.zeros(3)], path)
    with pytest.raises(CheckpointError, match="expected a checkpoint dict, got list"):
        read_checkpoint(path)


def test_dict_without_model_is_refused(tmp_path):
    path = tmp_path / "weights_only.pt"
    torch.save({"state_dict": {"w": torch.zeros(3)}}, path)
    with pytest.raises(CheckpointError, match=r"expected a 'model' or 'ema' entry, found keys \['state_dict'\]"):
        read_checkpoint(path)


def test_model_entry_of_the_wrong_kind_is_refused(tmp_path):
    path = tmp_path / "tensor_model.pt"
    torch.save({"model": torch.zeros(3)}, path)
    with pytest.raises(CheckpointError, match="expected a pickled YOLOv5 model, got Tensor"):
        read_checkpoint(path)


def _plain_pickle(path):
    with open(path, "wb") as f:
        pickle.dump({"model": {"weights": [1.0, 2.0]}}, f, protocol=pickle.HIGHEST_PROTOCOL)


def _random_bytes(path):
    path.write_bytes(os.urandom(4096))


def _empty(path):
    path.write_bytes(b"")


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("write", [_plain_pickle, _random_bytes, _empty], ids=["plain-pickle", "random-bytes", "empty"])
def test_not_a_torch_checkpoint_is_refused(tmp_path, write):
    path = tmp_path / "weights.pt"
    write(path)
    with pytest.raises(CheckpointError) as info:
        read_checkpoint(path)
    assert str(path) in str(info.value)
    assert "cannot read" in str(info.value)


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("write", [_plain_pickle, _random_bytes], ids=["plain-pickle", "random-bytes"])
def test_not_a_torch_checkpoint_message_gives_the_cause(tmp_path, write):
    path = tmp_path / "weights.pt"
    write(path)
    with pytest.raises(CheckpointError) as info:
        read_checkpoint(path)
    assert "weights_only` set to `False`" not in str(info.value)
    assert "will likely succeed" not in str(info.value)


def test_missing_file(tmp_path):
    path = tmp_path / "nope.pt"
    with pytest.raises(CheckpointError, match=f"weights file not found: {path}"):
        read_checkpoint(path)
    with pytest.raises(CheckpointError, match="not found"):
        load_model(path)


def test_directory_is_not_a_file(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        read_checkpoint(tmp_path)


# -- project state files -------------------------------------------------------------------------
def test_save_state_round_trip(tmp_path):
    model = YOLOv5.from_preset("yolov5n", seed=5).eval()
    path = tmp_path / "state.pt"
    save_state(model, path)

    plain = torch.load(path, weights_only=True)  # no stand-ins needed: plain data only
    assert plain["format"] == "yolo-pipeline/v1"
    assert set(plain["state_dict"]) == set(model.state_dict())

    ckpt = read_checkpoint(path)
    assert ckpt.source == "yolo-pipeline"
    assert ckpt.config == model.cfg and ckpt.names == model.names
    rebuilt = ckpt.build().eval()
    x = torch.rand(1, 3, 256, 320)
    with torch.no_grad():
        assert torch.equal(rebuilt(x), model(x))

    via_load = load_model(path, fuse=False, channels_last=False)
    with torch.no_grad():
        assert torch.equal(via_load(x), model(x))


def test_saved_checkpoint_model_round_trips(tmp_path, yolov5n_path):
    original = read_checkpoint(yolov5n_path).build().eval()
    path = tmp_path / "from_ultralytics.pt"
    save_state(original, path)
    again = read_checkpoint(path).build().eval()
    assert again.names == original.names
    x = torch.rand(1, 3, 320, 256)
    with torch.no_grad():
        assert torch.equal(again(x), original(x))


def test_project_state_missing_key_is_named(tmp_path):
    state = YOLOv5.from_preset("yolov5n").export_state()
    del state["state_dict"]
    path = tmp_path / "partial.pt"
    torch.save(state, path)
    with pytest.raises(CheckpointError, match="expected key 'state_dict'"):
        read_checkpoint(path)


def test_project_state_shape_mismatch_is_named(tmp_path):
    state = YOLOv5.from_preset("yolov5n").export_state()
    state["state_dict"]["model.0.conv.weight"] = torch.zeros(1, 1, 1, 1)
    path = tmp_path / "mismatch.pt"
    torch.save(state, path)
    with pytest.raises(ValueError, match="'model.0.conv.weight' expected shape"):
        read_checkpoint(path).build()


def test_channels_last_model_matches_the_nchw_model(tmp_path):
    model = YOLOv5.from_preset("yolov5n", seed=0).eval()
    path = tmp_path / "random.pt"
    save_state(model, path)
    x = torch.rand(1, 3, 256, 192)
    with torch.no_grad():
        nchw = load_model(path, channels_last=False)(x)
        nhwc = load_model(path, channels_last=True)(x)
    assert nhwc.shape == nchw.shape
    torch.testing.assert_close(nhwc, nchw, rtol=1e-4, atol=1e-3)
