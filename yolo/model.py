"""YOLOv5 (v6+ layout): the model built from its description (its layers are in yolo/layers.py).

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

from yolo.layers import C3, SPPF, Bottleneck, Concat, Conv, Detect
from yolo.names import default_names
from yolo.precision import Precision, check_precision, input_dtype
from yolo.presets import PRESETS

log = logging.getLogger(__name__)

MODULES: dict[str, type[nn.Module]] = {
    "Conv": Conv, "Bottleneck": Bottleneck, "C3": C3, "SPPF": SPPF, "Concat": Concat,
    "Detect": Detect, "nn.Upsample": nn.Upsample, "Upsample": nn.Upsample,
}
CHANNEL_MODULES = (Conv, Bottleneck, C3, SPPF)
# What ``--module-timing`` times: the model's 25 layers, the blocks inside them, or every leaf.
TIMING_SELECTIONS = {"layers": {"depth": 2}, "blocks": {"types": (Conv, Bottleneck, C3, SPPF, Detect)},
                     "leaves": {"leaves": True}}
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
