"""YOLOv5 (v6+ layout) in one file: layers in dependency order, then the model.

The model is built from the same description Ultralytics checkpoints carry (``depth_multiple``,
``width_multiple``, ``anchors``, ``backbone``, ``head``), so qualified module names match theirs
(``model.4.cv1.conv``) and their weights load by name.
"""

from __future__ import annotations

import copy
import logging
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.nn as nn
from torch.nn.utils.fusion import fuse_conv_bn_eval

from yolo.names import default_names
from yolo.precision import Precision, check_precision, input_dtype
from yolo.presets import PRESETS
from yolo.timing import timed

log = logging.getLogger(__name__)

BN_EPS = 1e-3
BN_MOMENTUM = 0.03


def autopad(kernel: int, padding: int | None = None) -> int:
    """'same' padding for odd kernels, as YOLOv5 uses it."""
    return kernel // 2 if padding is None else padding


class Conv(nn.Module):
    """Conv2d (no bias) + BatchNorm2d + SiLU; after ``fuse()`` the BN is folded into the conv."""

    def __init__(self, c1: int, c2: int, k: int = 1, s: int = 1, p: int | None = None,
                 g: int = 1, act: bool = True):
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, autopad(k, p), groups=g, bias=False)
        self.bn: nn.BatchNorm2d | None = nn.BatchNorm2d(c2, eps=BN_EPS, momentum=BN_MOMENTUM)
        self.act = nn.SiLU() if act else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        if self.bn is not None:
            x = self.bn(x)
        return self.act(x)

    def fuse(self) -> None:
        if self.bn is not None:
            self.conv = fuse_conv_bn_eval(self.conv, self.bn)
            self.bn = None


class Bottleneck(nn.Module):
    def __init__(self, c1: int, c2: int, shortcut: bool = True, g: int = 1, e: float = 0.5):
        super().__init__()
        c_ = int(c2 * e)
        self.cv1 = Conv(c1, c_, 1, 1)
        self.cv2 = Conv(c_, c2, 3, 1, g=g)
        self.add = shortcut and c1 == c2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C3(nn.Module):
    """CSP bottleneck with three convolutions."""

    def __init__(self, c1: int, c2: int, n: int = 1, shortcut: bool = True, g: int = 1,
                 e: float = 0.5):
        super().__init__()
        c_ = int(c2 * e)
        self.cv1 = Conv(c1, c_, 1, 1)
        self.cv2 = Conv(c1, c_, 1, 1)
        self.cv3 = Conv(2 * c_, c2, 1)
        self.m = nn.Sequential(*(Bottleneck(c_, c_, shortcut, g, e=1.0) for _ in range(n)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv3(torch.cat((self.m(self.cv1(x)), self.cv2(x)), 1))


class SPPF(nn.Module):
    """Spatial pyramid pooling, fast: three chained max-pools instead of three parallel ones."""

    def __init__(self, c1: int, c2: int, k: int = 5):
        super().__init__()
        c_ = c1 // 2
        self.cv1 = Conv(c1, c_, 1, 1)
        self.cv2 = Conv(c_ * 4, c2, 1, 1)
        self.m = nn.MaxPool2d(kernel_size=k, stride=1, padding=k // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.cv1(x)
        y1 = self.m(x)
        y2 = self.m(y1)
        return self.cv2(torch.cat((x, y1, y2, self.m(y2)), 1))


class Concat(nn.Module):
    def __init__(self, dimension: int = 1):
        super().__init__()
        self.d = dimension

    def forward(self, xs: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(xs, self.d)


@timed("Detect.decode")
def decode_inplace(maps: list[torch.Tensor], grids: list[torch.Tensor], anchors: list[torch.Tensor],
                   strides: list[float]) -> torch.Tensor:
    """Decode raw head maps into boxes, writing xywh into the sigmoid output.

    Args:
        maps: per level Tensor[B, na, no, ny, nx], raw conv outputs (channel-first).
        grids: per level Tensor[1, na, 2, ny, nx], (cell - 0.5) * stride.
        anchors: per level Tensor[1, na, 2, 1, 1], 4 * anchor size in pixels.
        strides: per level stride in pixels.

    Returns:
        Tensor[B, N, no]: (cx, cy, w, h, objectness, class probs...) in input pixels,
        N = sum of na * ny * nx over levels, level-major then anchor, row, column.
    """
    pieces = []
    for raw, grid, anchor, stride in zip(maps, grids, anchors, strides):
        y = raw.sigmoid()
        y[:, :, 0:2].mul_(2 * stride).add_(grid)  # xy = (2 * sig - 0.5 + cell) * stride
        y[:, :, 2:4].square_().mul_(anchor)  # wh = (2 * sig) ** 2 * anchor
        pieces.extend(_rows_per_anchor(y))
    return torch.cat(pieces, 1)


@timed("Detect.decode")
def decode_outplace(maps: list[torch.Tensor], grids: list[torch.Tensor], anchors: list[torch.Tensor],
                    strides: list[float]) -> torch.Tensor:
    """Same result as ``decode_inplace`` without in-place ops or slice assignment (exportable).

    Each (level, anchor) block is assembled in the output's row layout, so the only extra work
    over the in-place path is one copy of the confidence columns, whatever the maps' layout."""
    pieces = []
    for raw, grid, anchor, stride in zip(maps, grids, anchors, strides):
        rows = _rows_per_anchor(raw.sigmoid())
        grid_rows = _rows_per_anchor(grid)
        for a, y in enumerate(rows):
            xy = y[..., 0:2] * (2 * stride) + grid_rows[a]
            wh = y[..., 2:4].square() * anchor[:, a].view(1, 1, 2)
            pieces.append(torch.cat((xy, wh, y[..., 4:]), -1))
    return torch.cat(pieces, 1)


def _rows_per_anchor(y: torch.Tensor) -> list[torch.Tensor]:
    # [B, na, no, ny, nx] -> na views of [B, ny*nx, no]; the final torch.cat does the transpose
    # copy, so no separate permute().contiguous() pass is needed.
    b, na, no = y.shape[:3]
    return [y[:, a].reshape(b, no, -1).transpose(1, 2) for a in range(na)]


class Detect(nn.Module):
    """Detection head: a 1x1 conv per level, then sigmoid decoding into boxes in input pixels."""

    def __init__(self, nc: int = 80, anchors: Sequence[Sequence[float]] = (), ch: Sequence[int] = (),
                 inplace: bool = True):
        super().__init__()
        self.nc = nc
        self.no = nc + 5
        self.nl = len(anchors)
        self.na = len(anchors[0]) // 2
        self.inplace = inplace
        # Anchors are kept in grid units (pixels / stride) like Ultralytics, so weights load as is.
        self.register_buffer("anchors", torch.tensor(anchors, dtype=torch.float32).view(self.nl, -1, 2))
        self.register_buffer("stride", torch.ones(self.nl), persistent=False)
        self.m = nn.ModuleList(nn.Conv2d(c, self.no * self.na, 1) for c in ch)
        self._grid_cache: dict[tuple, tuple[list[torch.Tensor], list[torch.Tensor], list[float]]] = {}

    def forward(self, xs: list[torch.Tensor]) -> torch.Tensor | list[torch.Tensor]:
        maps = []
        for i, conv in enumerate(self.m):
            # Decode in fp32 whatever the model's precision: bf16 keeps 8 bits of mantissa, so
            # box coordinates near 640 would come in steps of 4 pixels (fp16: half a pixel).
            x = conv(xs[i]).float()
            b, _, ny, nx = x.shape
            maps.append(x.view(b, self.na, self.no, ny, nx))  # [B, na, no, ny, nx]
        if self.training:
            return maps
        decode = decode_inplace if self.inplace else decode_outplace
        with torch.autocast(maps[0].device.type, enabled=False):
            return decode(maps, *self._grids(maps))

    def _grids(self, maps: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor], list[float]]:
        key = tuple(m.shape[-2:] for m in maps) + (maps[0].device, maps[0].dtype)
        if key not in self._grid_cache:
            if len(self._grid_cache) > 32:  # many rect shapes: keep memory bounded
                self._grid_cache.clear()
            self._grid_cache[key] = self._make_grids(maps)
        return self._grid_cache[key]

    def _make_grids(self, maps):
        # Built once per input shape; strides become Python floats so forward never syncs a GPU.
        grids, anchors, strides = [], [], [float(s) for s in self.stride.tolist()]
        for i, m in enumerate(maps):
            ny, nx = m.shape[-2:]
            stride = strides[i]
            yv, xv = torch.meshgrid(torch.arange(ny, device=m.device), torch.arange(nx, device=m.device),
                                    indexing="ij")
            xy = torch.stack((xv, yv), 0).to(m.dtype)  # [2, ny, nx]
            grids.append(((xy - 0.5) * stride).expand(1, self.na, 2, ny, nx).contiguous())
            wh = self.anchors[i].to(m.device, torch.float32) * stride * 4  # [na, 2], (2*sig)^2 = 4*sig^2
            anchors.append(wh.to(m.dtype).view(1, self.na, 2, 1, 1))
        return grids, anchors, strides

    def _apply(self, fn, recurse=True):
        self._grid_cache = {}  # device or dtype changed: cached grids are stale
        return super()._apply(fn, recurse)


MODULES: dict[str, type[nn.Module]] = {
    "Conv": Conv, "Bottleneck": Bottleneck, "C3": C3, "SPPF": SPPF, "Concat": Concat,
    "Detect": Detect, "nn.Upsample": nn.Upsample, "Upsample": nn.Upsample,
}
CHANNEL_MODULES = (Conv, Bottleneck, C3, SPPF)
REPEATED_MODULES = (C3,)

_ANCHORS_P345 = [[10, 13, 16, 30, 33, 23], [30, 61, 62, 45, 59, 119], [116, 90, 156, 198, 373, 326]]
_BACKBONE = [
    [-1, 1, "Conv", [64, 6, 2, 2]], [-1, 1, "Conv", [128, 3, 2]], [-1, 3, "C3", [128]],
    [-1, 1, "Conv", [256, 3, 2]], [-1, 6, "C3", [256]], [-1, 1, "Conv", [512, 3, 2]],
    [-1, 9, "C3", [512]], [-1, 1, "Conv", [1024, 3, 2]], [-1, 3, "C3", [1024]],
    [-1, 1, "SPPF", [1024, 5]],
]
_HEAD = [
    [-1, 1, "Conv", [512, 1, 1]], [-1, 1, "nn.Upsample", [None, 2, "nearest"]],
    [[-1, 6], 1, "Concat", [1]], [-1, 3, "C3", [512, False]],
    [-1, 1, "Conv", [256, 1, 1]], [-1, 1, "nn.Upsample", [None, 2, "nearest"]],
    [[-1, 4], 1, "Concat", [1]], [-1, 3, "C3", [256, False]],
    [-1, 1, "Conv", [256, 3, 2]], [[-1, 14], 1, "Concat", [1]], [-1, 3, "C3", [512, False]],
    [-1, 1, "Conv", [512, 3, 2]], [[-1, 10], 1, "Concat", [1]], [-1, 3, "C3", [1024, False]],
    [[17, 20, 23], 1, "Detect", ["nc", "anchors"]],
]


@dataclass
class ModelConfig:
    """The model description an Ultralytics checkpoint carries as ``model.yaml``."""

    depth_multiple: float
    width_multiple: float
    nc: int = 80
    anchors: list = field(default_factory=lambda: copy.deepcopy(_ANCHORS_P345))
    backbone: list = field(default_factory=lambda: copy.deepcopy(_BACKBONE))
    head: list = field(default_factory=lambda: copy.deepcopy(_HEAD))
    ch: int = 3

    @classmethod
    def preset(cls, name: str, nc: int = 80) -> "ModelConfig":
        if name not in PRESETS:
            raise ValueError(f"unknown model preset: expected one of {sorted(PRESETS)}, got {name!r}")
        gd, gw = PRESETS[name]
        return cls(depth_multiple=gd, width_multiple=gw, nc=nc)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ModelConfig":
        required = ("depth_multiple", "width_multiple", "anchors", "backbone", "head")
        missing = [k for k in required if k not in d]
        if missing:
            raise ValueError(f"model description: expected keys {list(required)}, missing {missing}")
        return cls(depth_multiple=float(d["depth_multiple"]), width_multiple=float(d["width_multiple"]),
                   nc=int(d.get("nc", 80)), anchors=copy.deepcopy(d["anchors"]),
                   backbone=copy.deepcopy(d["backbone"]), head=copy.deepcopy(d["head"]),
                   ch=int(d.get("ch", 3)))

    def to_dict(self) -> dict[str, Any]:
        return {"nc": self.nc, "depth_multiple": self.depth_multiple, "width_multiple": self.width_multiple,
                "anchors": copy.deepcopy(self.anchors), "backbone": copy.deepcopy(self.backbone),
                "head": copy.deepcopy(self.head), "ch": self.ch}


def make_divisible(x: float, divisor: int = 8) -> int:
    return int(math.ceil(x / divisor) * divisor)


def _resolve_arg(arg: Any, cfg: ModelConfig) -> Any:
    # Checkpoint descriptions hold some arguments as source text; map the known ones, no eval().
    if not isinstance(arg, str):
        return arg
    known = {"None": None, "nc": cfg.nc, "anchors": cfg.anchors, "nearest": "nearest",
             "True": True, "False": False}
    if arg not in known:
        raise ValueError(f"model description: expected an argument in {sorted(known)}, got {arg!r}")
    return known[arg]


def build_layers(cfg: ModelConfig) -> tuple[nn.Sequential, list[int | list[int]], set[int]]:
    """Build the layer list; returns (layers, the input index or indices of each, saved outputs)."""
    na = len(cfg.anchors[0]) // 2
    no = na * (cfg.nc + 5)
    channels = [cfg.ch]
    layers, sources, save = [], [], set()
    for i, entry in enumerate(cfg.backbone + cfg.head):
        if len(entry) != 4:
            raise ValueError(f"model description layer {i}: expected [from, number, module, args], got {entry!r}")
        f, n, name, args = entry
        if name not in MODULES:
            raise ValueError(f"model description layer {i}: expected a module in {sorted(MODULES)}, got {name!r}")
        module_cls = MODULES[name]
        args = [_resolve_arg(a, cfg) for a in args]
        n = max(round(n * cfg.depth_multiple), 1) if n > 1 else n
        if module_cls in CHANNEL_MODULES:
            c1, c2 = channels[f], args[0]
            if c2 != no:
                c2 = make_divisible(c2 * cfg.width_multiple, 8)
            args = [c1, c2, *args[1:]]
            if module_cls in REPEATED_MODULES:
                args.insert(2, n)
                n = 1
        elif module_cls is Concat:
            c2 = sum(channels[x] for x in f)
        elif module_cls is Detect:
            args.append([channels[x] for x in f])
            c2 = None
        else:
            c2 = channels[f]
        layer = nn.Sequential(*(module_cls(*args) for _ in range(n))) if n > 1 else module_cls(*args)
        layers.append(layer)
        sources.append(f)
        save.update(x % i for x in ([f] if isinstance(f, int) else f) if x != -1)
        if i == 0:
            channels = []
        channels.append(c2)
    return nn.Sequential(*layers), sources, save


class YOLOv5(nn.Module):
    """YOLOv5 detector. ``forward(x: Tensor[B, 3, H, W] RGB in [0, 1])`` returns float32
    Tensor[B, N, 5 + nc] rows of (cx, cy, w, h, objectness, class probabilities) in input pixels,
    whatever the precision (see ``set_precision``); ``x`` must have dtype ``input_dtype``."""

    def __init__(self, cfg: ModelConfig, names: Sequence[str] | None = None):
        super().__init__()
        self.cfg = cfg
        self.model, self.sources, self.save = build_layers(cfg)
        self.names = list(names) if names is not None else default_names(cfg.nc)
        if len(self.names) != cfg.nc:
            raise ValueError(f"class names: expected {cfg.nc}, got {len(self.names)}")
        self.fused = False
        self.precision: Precision = "fp32"
        detect = self.detect
        detect.stride.copy_(self._measure_strides())

    @property
    def detect(self) -> Detect:
        head = self.model[-1]
        inner = getattr(head, "module", head)  # the head may be wrapped by a TimedModule
        if not isinstance(inner, Detect):
            raise RuntimeError(f"expected the last layer to be Detect, got {type(inner).__name__}")
        return inner

    @property
    def stride(self) -> torch.Tensor:
        return self.detect.stride

    @property
    def max_stride(self) -> int:
        return int(self.stride.max().item())

    @property
    def input_dtype(self) -> torch.dtype:
        return input_dtype(self.precision)

    def set_precision(self, precision: Precision) -> "YOLOv5":
        """``fp32``; ``fp16``: half weights, half input; ``bf16``: fp32 weights and input, every
        convolution under bf16 autocast (the layers between them then see bf16 tensors).
        The head's maps are decoded in fp32 in every precision."""
        check_precision(precision)
        if precision == "fp16":
            self.half()
        else:
            self.float()
        self.precision = precision
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=self.precision == "bf16"):
            return self._forward_layers(x)

    def _forward_layers(self, x: torch.Tensor) -> torch.Tensor:
        outputs: list[torch.Tensor | None] = []
        for i, (layer, f) in enumerate(zip(self.model, self.sources)):
            if f != -1:
                x = outputs[f] if isinstance(f, int) else [x if j == -1 else outputs[j] for j in f]
            x = layer(x)
            outputs.append(x if i in self.save else None)
        return x

    @torch.no_grad()
    def _measure_strides(self, size: int = 256) -> torch.Tensor:
        # Run everything but Detect on a dummy input and compare feature map sizes to the input.
        x: Any = torch.zeros(1, self.cfg.ch, size, size)
        outputs: list = []
        was_training = self.training
        self.eval()
        for i, (layer, f) in enumerate(zip(self.model, self.sources)):
            if f != -1:
                x = outputs[f] if isinstance(f, int) else [x if j == -1 else outputs[j] for j in f]
            if layer is self.model[-1]:
                strides = torch.tensor([size / t.shape[-2] for t in x])
                break
            x = layer(x)
            outputs.append(x if i in self.save else None)
        self.train(was_training)
        return strides

    def initialize_random(self, seed: int | None = None) -> "YOLOv5":
        """Give a freshly built model YOLOv5's training-start biases (few, not absurd, boxes)."""
        if seed is not None:
            torch.manual_seed(seed)
        detect = self.detect
        for conv, s in zip(detect.m, detect.stride):
            b = conv.bias.view(detect.na, -1).detach()
            b[:, 4] = math.log(8 / (640 / float(s)) ** 2)  # about 8 objects per 640 image
            b[:, 5:] = math.log(0.6 / (detect.nc - 0.99))
            conv.bias = nn.Parameter(b.view(-1))
        return self

    def fuse(self) -> "YOLOv5":
        """Fold every BatchNorm into its conv for inference; idempotent."""
        if self.training:
            raise RuntimeError("expected an eval-mode model to fuse (BatchNorm folds its running "
                               "statistics), got one in training mode: call eval() first")
        for m in self.modules():
            if isinstance(m, Conv):
                m.fuse()
        self.fused = True
        return self

    def set_inplace(self, inplace: bool) -> "YOLOv5":
        self.detect.inplace = inplace
        return self

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def export_state(self) -> dict[str, Any]:
        """A plain dict (tensors, lists, strings) that ``torch.load(weights_only=True)`` reads back."""
        if self.fused:
            raise RuntimeError("expected an unfused model to save, got a fused one (save before fuse())")
        return {"format": "yolo-pipeline/v1", "config": self.cfg.to_dict(), "names": list(self.names),
                "state_dict": {k: v.detach().cpu() for k, v in self.state_dict().items()}}

    @classmethod
    def from_preset(cls, name: str, nc: int = 80, seed: int | None = 0) -> "YOLOv5":
        log.warning("building %s with random weights: timings are valid, detections are meaningless", name)
        return cls(ModelConfig.preset(name, nc)).initialize_random(seed)

    @classmethod
    def from_state(cls, cfg: ModelConfig, names: Sequence[str], state_dict: dict[str, torch.Tensor]) -> "YOLOv5":
        model = cls(cfg, names)
        load_matching_state(model, state_dict)
        return model


def load_matching_state(model: nn.Module, state_dict: dict[str, torch.Tensor]) -> None:
    """Load weights after checking names and shapes; the error names the first mismatch."""
    own = model.state_dict()
    missing = [k for k in own if k not in state_dict]
    unexpected = [k for k in state_dict if k not in own]
    if missing:
        raise ValueError(f"checkpoint does not match the model: expected tensor {missing[0]!r} "
                         f"({len(missing)} missing in all), not found in the checkpoint")
    if unexpected:
        raise ValueError(f"checkpoint does not match the model: got unexpected tensor {unexpected[0]!r} "
                         f"({len(unexpected)} unexpected in all)")
    for k, v in own.items():
        if v.shape != state_dict[k].shape:
            raise ValueError(f"checkpoint does not match the model: tensor {k!r} expected shape "
                             f"{tuple(v.shape)}, got {tuple(state_dict[k].shape)}")
    converted = {k: state_dict[k].to(own[k].dtype) for k in own}
    model.load_state_dict(converted, strict=True)
