"""yolo.model: presets, output shapes, in-place vs out-of-place decoding against a slow
reference, BatchNorm fusion, and the errors at the description and weight-loading boundaries."""

from __future__ import annotations

import copy

import pytest
import torch

from yolo.layers import Detect, decode_inplace, decode_outplace
from yolo.model import ModelConfig, YOLOv5, load_matching_state

# Parameter counts Ultralytics prints for these models (before fusion).
PRESET_PARAMS = {"yolov5n": 1_872_157, "yolov5s": 7_235_389}
YOLOV5N_FUSED_PARAMS = 1_867_405  # the official yolov5n.pt once Conv+BN are fused


def _rows(h: int, w: int, na: int = 3, strides=(8, 16, 32)) -> int:
    return sum(na * (h // s) * (w // s) for s in strides)


@pytest.fixture(scope="module")
def random_n() -> YOLOv5:
    """Random-weight yolov5n in eval mode with non-trivial BatchNorm statistics, not fused."""
    torch.manual_seed(0)
    model = YOLOv5.from_preset("yolov5n", seed=0).eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0, 0.1)
    return model


def _max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


# -- presets and shapes --------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(PRESET_PARAMS))
def test_preset_builds_with_ultralytics_param_count(name):
    model = YOLOv5.from_preset(name)
    assert model.num_params() == PRESET_PARAMS[name]
    assert model.stride.tolist() == [8.0, 16.0, 32.0]
    assert len(model.model) == 25
    assert len(model.names) == 80 and model.names[0] == "person"


def test_random_yolov5n_fused_param_count_matches_checkpoint():
    model = YOLOv5.from_preset("yolov5n").eval().fuse()
    assert model.fused
    assert model.num_params() == YOLOV5N_FUSED_PARAMS
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())


def test_unknown_preset_is_named():
    with pytest.raises(ValueError, match="yolov5q"):
        ModelConfig.preset("yolov5q")


@pytest.mark.parametrize("batch, h, w", [(1, 640, 640), (1, 640, 480), (2, 640, 640)])
def test_output_shape(random_n, batch, h, w):
    with torch.no_grad():
        y = random_n(torch.rand(batch, 3, h, w))
    assert y.shape == (batch, _rows(h, w), 85)
    if (h, w) == (640, 640):
        assert y.shape[1] == 25200
    assert torch.isfinite(y).all()


def test_training_mode_returns_raw_maps():
    model = YOLOv5.from_preset("yolov5n").train()
    maps = model(torch.rand(1, 3, 256, 192))
    assert [tuple(m.shape) for m in maps] == [(1, 3, 85, 256 // s, 192 // s) for s in (8, 16, 32)]


# -- decoding ------------------------------------------------------------------------------------
def _reference_decode(maps, anchors_grid_units, strides):
    """Cell-by-cell YOLOv5 decoding with Python loops: obviously right, slow."""
    rows = []
    for raw, anchors, stride in zip(maps, anchors_grid_units, strides):
        b, na, no, ny, nx = raw.shape
        level = torch.empty(b, na, ny, nx, no)
        for a in range(na):
            for i in range(ny):
                for j in range(nx):
                    s = raw[:, a, :, i, j].sigmoid()  # [B, no]
                    cx = (s[:, 0] * 2 - 0.5 + j) * stride
                    cy = (s[:, 1] * 2 - 0.5 + i) * stride
                    w = (s[:, 2] * 2) ** 2 * anchors[a, 0] * stride
                    h = (s[:, 3] * 2) ** 2 * anchors[a, 1] * stride
                    level[:, a, i, j] = torch.cat((torch.stack((cx, cy, w, h), 1), s[:, 4:]), 1)
        rows.append(level.reshape(b, na * ny * nx, no))
    return torch.cat(rows, 1)


def _small_head(nc: int = 3) -> tuple[Detect, list[torch.Tensor]]:
    torch.manual_seed(1)
    anchors = [[10, 13, 16, 30, 33, 23], [30, 61, 62, 45, 59, 119]]
    detect = Detect(nc=nc, anchors=anchors, ch=(4, 8)).eval()
    detect.stride.copy_(torch.tensor([8.0, 16.0]))
    maps = [torch.randn(2, detect.na, detect.no, 4, 6) * 2, torch.randn(2, detect.na, detect.no, 2, 3) * 2]
    return detect, maps


@pytest.mark.parametrize("decode", [decode_inplace, decode_outplace], ids=["inplace", "outplace"])
def test_decode_matches_reference(decode):
    detect, maps = _small_head()
    expected = _reference_decode(maps, detect.anchors, [8.0, 16.0])
    got = decode([m.clone() for m in maps], *detect._grids(maps))
    assert got.shape == expected.shape == (2, 3 * (24 + 6), 8)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-4)


def test_decode_inplace_leaves_raw_maps_untouched():
    detect, maps = _small_head()
    copies = [m.clone() for m in maps]
    decode_inplace(maps, *detect._grids(maps))
    assert all(torch.equal(m, c) for m, c in zip(maps, copies))


def _inplace_vs_outplace(model: YOLOv5, x: torch.Tensor) -> float:
    model = copy.deepcopy(model)
    with torch.no_grad():
        a = model.set_inplace(True)(x)
        b = model.set_inplace(False)(x)
    assert a.shape == b.shape
    return 0.0 if torch.equal(a, b) else _max_abs_diff(a, b)


def test_inplace_equals_outplace_random_weights(random_n):
    assert _inplace_vs_outplace(random_n, torch.rand(2, 3, 320, 256)) <= 1e-6


def test_inplace_equals_outplace_checkpoint(yolov5n):
    assert _inplace_vs_outplace(yolov5n, torch.rand(1, 3, 640, 480)) <= 1e-6


# -- fusion --------------------------------------------------------------------------------------
def _relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return _max_abs_diff(got, expected) / float(expected.abs().max())


def test_fuse_preserves_outputs_random_weights(random_n):
    x = torch.rand(1, 3, 320, 320)
    fused = copy.deepcopy(random_n).fuse()
    with torch.no_grad():
        expected, got = random_n(x), fused(x)
        again = fused.fuse()(x)  # idempotent
    assert _relative_error(got, expected) <= 1e-4
    assert torch.equal(again, got)


def test_fuse_preserves_outputs_checkpoint(yolov5n_path, yolov5n):
    from yolo.checkpoint import load_model

    unfused = load_model(yolov5n_path, fuse=False)
    assert any(isinstance(m, torch.nn.BatchNorm2d) for m in unfused.modules())
    x = torch.rand(1, 3, 320, 320)
    with torch.no_grad():
        assert _relative_error(yolov5n(x), unfused(x)) <= 1e-4


def test_fuse_refuses_training_mode():
    model = YOLOv5.from_preset("yolov5n").train()
    with pytest.raises(RuntimeError, match="expected an eval-mode model"):
        model.fuse()
    assert not model.fused and any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())


def test_fused_model_refuses_export():
    with pytest.raises(RuntimeError, match="fused"):
        YOLOv5.from_preset("yolov5n").eval().fuse().export_state()


# -- the description boundary --------------------------------------------------------------------
@pytest.mark.parametrize("key", ["depth_multiple", "width_multiple", "anchors", "backbone", "head"])
def test_from_dict_names_missing_key(key):
    d = ModelConfig.preset("yolov5n").to_dict()
    del d[key]
    with pytest.raises(ValueError, match=f"missing \\['{key}'\\]"):
        ModelConfig.from_dict(d)


def test_from_dict_round_trip():
    cfg = ModelConfig.preset("yolov5s")
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg


def test_unknown_module_is_named():
    d = ModelConfig.preset("yolov5n").to_dict()
    d["backbone"][3] = [-1, 1, "GhostConv", [256, 3, 2]]
    with pytest.raises(ValueError, match=r"layer 3:.*'GhostConv'"):
        YOLOv5(ModelConfig.from_dict(d))


def test_unknown_argument_is_named():
    d = ModelConfig.preset("yolov5n").to_dict()
    d["head"][1] = [-1, 1, "nn.Upsample", ["None", 2, "bilinear"]]
    with pytest.raises(ValueError, match="'bilinear'"):
        YOLOv5(ModelConfig.from_dict(d))


def test_malformed_layer_is_named():
    d = ModelConfig.preset("yolov5n").to_dict()
    d["backbone"][0] = [-1, 1, "Conv"]
    with pytest.raises(ValueError, match="layer 0: expected \\[from, number, module, args\\]"):
        YOLOv5(ModelConfig.from_dict(d))


# -- the weight-loading boundary -----------------------------------------------------------------
@pytest.fixture(scope="module")
def fresh_state() -> dict[str, torch.Tensor]:
    return YOLOv5.from_preset("yolov5n", seed=3).state_dict()


def test_load_matching_state_loads_every_tensor(fresh_state):
    model = YOLOv5.from_preset("yolov5n", seed=4)
    load_matching_state(model, fresh_state)
    assert all(torch.equal(v, fresh_state[k]) for k, v in model.state_dict().items())


def test_load_matching_state_names_first_shape_mismatch(fresh_state):
    state = dict(fresh_state)
    state["model.8.cv1.conv.weight"] = torch.zeros(7, 7, 1, 1)
    state["model.20.cv3.conv.weight"] = torch.zeros(3, 3, 1, 1)  # later in order: not the one named
    with pytest.raises(ValueError, match=r"'model\.8\.cv1\.conv\.weight' expected shape \(128, 256, 1, 1\), got \(7, 7, 1, 1\)"):
        load_matching_state(YOLOv5.from_preset("yolov5n"), state)


def test_load_matching_state_names_missing_and_unexpected(fresh_state):
    state = dict(fresh_state)
    del state["model.24.m.2.bias"]
    with pytest.raises(ValueError, match=r"'model\.24\.m\.2\.bias' \(1 missing"):
        load_matching_state(YOLOv5.from_preset("yolov5n"), state)
    state = dict(fresh_state, **{"model.25.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match=r"unexpected tensor 'model\.25\.weight'"):
        load_matching_state(YOLOv5.from_preset("yolov5n"), state)


def test_load_matching_state_converts_half_weights(fresh_state):
    half = {k: v.half() if v.is_floating_point() else v for k, v in fresh_state.items()}
    model = YOLOv5.from_preset("yolov5n", seed=4)
    load_matching_state(model, half)
    weight = model.state_dict()["model.0.conv.weight"]
    assert weight.dtype == torch.float32
    assert torch.equal(weight, half["model.0.conv.weight"].float())


# -- precision -----------------------------------------------------------------------------------
def test_bf16_on_cpu_returns_float32_close_to_fp32(random_n):
    fp32 = copy.deepcopy(random_n).fuse()
    bf16 = copy.deepcopy(fp32).set_precision("bf16")
    assert bf16.input_dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in bf16.parameters())  # autocast, not bf16 weights
    x = torch.rand(1, 3, 128, 96)
    with torch.no_grad():
        expected, got = fp32(x), bf16(x)
    assert got.dtype == torch.float32 and got.shape == expected.shape
    assert not torch.equal(got, expected), "expected the convolutions to run in bf16"
    assert _relative_error(got, expected) <= 3e-2
    with torch.no_grad():
        assert torch.equal(bf16.set_precision("fp32")(x), expected)


def test_bf16_decodes_the_head_maps_in_float32(random_n):
    model = copy.deepcopy(random_n).fuse().set_precision("bf16")
    seen = []
    hook = model.detect.register_forward_hook(lambda m, args, out: seen.append((args[0][0].dtype, out.dtype)))
    with torch.no_grad():
        model(torch.rand(1, 3, 64, 64))
    hook.remove()
    assert seen == [(torch.bfloat16, torch.float32)]  # bf16 features in, fp32 boxes out


def test_unknown_precision_is_named(random_n):
    with pytest.raises(ValueError, match="got 'fp8'"):
        copy.deepcopy(random_n).set_precision("fp8")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="fp16 is tested on CUDA only (no GPU)")
def test_half_precision_on_cuda(random_n):
    fp32 = copy.deepcopy(random_n).fuse().cuda()
    fp16 = copy.deepcopy(fp32).set_precision("fp16")
    assert fp16.input_dtype == torch.float16
    x = torch.rand(2, 3, 640, 480, device="cuda")
    with torch.no_grad():
        expected, got = fp32(x), fp16(x.half())
    assert got.dtype == torch.float32 and got.shape == expected.shape
    assert torch.isfinite(got).all()
    assert _relative_error(got.float(), expected) <= 1e-2
    cpu = copy.deepcopy(random_n).fuse()
    with torch.no_grad():
        assert _relative_error(expected.cpu(), cpu(x.cpu())) <= 1e-3
