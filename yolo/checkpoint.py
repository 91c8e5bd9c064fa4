"""Load YOLOv5 weights without Ultralytics' code and without running arbitrary pickle code.

Ultralytics checkpoints are pickles of their own classes (``models.yolo.Model``, ...). They are
read with torch's hardened ``weights_only`` unpickler, with those class names mapped to inert
stand-ins that only hold attributes; nothing else a pickle may ask for is allowed. The weights
are then copied by name into this project's own ``YOLOv5``.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from yolo.model import ModelConfig, YOLOv5
from yolo.names import default_names
from yolo.precision import Precision, check_precision, choose_precision, warn_if_emulated

log = logging.getLogger(__name__)

PROJECT_FORMAT = "yolo-pipeline/v1"

# Classes that an Ultralytics YOLOv5 (v5/v6/v7) detection checkpoint pickles.
ULTRALYTICS_CLASSES = (
    ("models.yolo", "Model"), ("models.yolo", "DetectionModel"), ("models.yolo", "Detect"),
    ("models.common", "Conv"), ("models.common", "C3"), ("models.common", "Bottleneck"),
    ("models.common", "SPPF"), ("models.common", "SPP"), ("models.common", "Concat"),
    ("models.common", "Focus"),
)
# The torch.nn classes such a checkpoint holds; torch's own code, no side effects on load.
TORCH_CLASSES = (nn.Sequential, nn.ModuleList, nn.Conv2d, nn.BatchNorm2d, nn.SiLU, nn.MaxPool2d,
                 nn.Upsample, nn.Identity, nn.LeakyReLU, nn.Hardswish)


class CheckpointError(ValueError):
    """The file is not a loadable YOLOv5 checkpoint; the message says why."""


class _Inert:
    """Stand-in for a pickled Ultralytics class: unpickling only fills ``__dict__``."""

    def __repr__(self) -> str:
        return f"<stand-in for {type(self).__module__}.{type(self).__qualname__}>"


def _stand_in(module: str, name: str) -> type:
    return type(name, (_Inert,), {"__module__": module, "__qualname__": name})


STAND_INS = tuple(_stand_in(m, n) for m, n in ULTRALYTICS_CLASSES)
SAFE_GLOBALS = list(STAND_INS) + list(TORCH_CLASSES)


@dataclass
class Checkpoint:
    config: ModelConfig
    names: list[str]
    state_dict: dict[str, torch.Tensor]
    source: str  # "ultralytics" or "yolo-pipeline"
    stride: list[float] | None = None

    def build(self) -> YOLOv5:
        model = YOLOv5.from_state(self.config, self.names, self.state_dict)
        if self.stride is not None and [float(s) for s in model.stride] != [float(s) for s in self.stride]:
            raise CheckpointError(f"checkpoint stride: expected {model.stride.tolist()} from the model "
                                  f"description, got {self.stride}")
        return model


def read_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Read an Ultralytics YOLOv5 checkpoint or a state file saved by this project."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise CheckpointError(f"weights file not found: {path}")
    with torch.serialization.safe_globals(SAFE_GLOBALS):
        try:
            raw = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # torch raises UnpicklingError, RuntimeError, EOFError...
            raise CheckpointError(_explain_refusal(path, exc)) from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: expected a checkpoint dict, got {type(raw).__name__}")
    if raw.get("format") == PROJECT_FORMAT:
        return _from_project_state(path, raw)
    return _from_ultralytics(path, raw)


def load_model(weights: str | os.PathLike | None, *, preset: str = "yolov5n", device: str | torch.device = "cpu",
               precision: Precision | None = None, half: bool = False, fuse: bool = True, inplace: bool = True,
               channels_last: bool = True, seed: int | None = 0) -> YOLOv5:
    """The model ready for inference: from ``weights``, or a random ``preset`` when None.

    ``precision`` is ``fp32``, ``bf16`` or ``fp16`` (see ``YOLOv5.set_precision``); choose it
    with :func:`yolo.precision.choose_precision`, which refuses an emulated bf16. ``half`` is
    the older spelling, kept for callers that do not pass ``precision``: it means
    ``choose_precision(device, half)``. ``channels_last`` (NHWC weights) measured about 20 %
    less CPU per forward here. Feed the model ``model.input_dtype`` tensors."""
    if precision is None:
        precision = choose_precision(device, half)
    elif half and precision == "fp32":
        raise ValueError(f"expected precision bf16 or fp16 with half=True, got {precision!r}")
    check_precision(precision)
    warn_if_emulated(precision, device)
    model = read_checkpoint(weights).build() if weights else YOLOv5.from_preset(preset, seed=seed)
    model.eval()
    if fuse:
        model.fuse()
    model.set_inplace(inplace)
    model.to(device)
    model.set_precision(precision)
    if channels_last:
        model.to(memory_format=torch.channels_last)
    return model.requires_grad_(False)


def save_state(model: YOLOv5, path: str | os.PathLike) -> None:
    torch.save(model.export_state(), os.fspath(path))


def _explain_refusal(path: str, exc: Exception) -> str:
    text = str(exc)
    match = re.search(r"GLOBAL ([\w.]+)", text) or re.search(r"unrecognized function ([^\s]+)", text)
    if match:
        return (f"refusing to load {path}: it asks for the global {match.group(1)!r}, which a YOLOv5 "
                f"checkpoint does not need (only torch tensors, torch.nn layers and YOLOv5 module "
                f"names are allowed); the file was not executed")
    cause = text.split("WeightsUnpickler error:", 1)[-1].strip().splitlines()
    detail = cause[0] if cause and "WeightsUnpickler" in text else type(exc).__name__
    return f"cannot read {path}: not a checkpoint saved with torch.save ({detail}); it was not executed"


def _from_project_state(path: str, raw: dict[str, Any]) -> Checkpoint:
    for key in ("config", "names", "state_dict"):
        if key not in raw:
            raise CheckpointError(f"{path}: expected key {key!r} in a {PROJECT_FORMAT} file, not found")
    return Checkpoint(ModelConfig.from_dict(raw["config"]), list(raw["names"]), dict(raw["state_dict"]),
                      source="yolo-pipeline")


def _from_ultralytics(path: str, raw: dict[str, Any]) -> Checkpoint:
    pickled = raw.get("model") if raw.get("model") is not None else raw.get("ema")
    if pickled is None:
        raise CheckpointError(f"{path}: expected a 'model' or 'ema' entry, found keys {sorted(raw)}")
    if not isinstance(pickled, _Inert):
        raise CheckpointError(f"{path}: expected a pickled YOLOv5 model, got {type(pickled).__name__}")
    attrs = vars(pickled)
    description = attrs.get("yaml")
    if not isinstance(description, dict):
        raise CheckpointError(f"{path}: expected the model description dict ('yaml'), got {type(description).__name__}")
    config = ModelConfig.from_dict(description)
    names = attrs.get("names") or default_names(config.nc)
    if isinstance(names, dict):  # later releases store {index: name}
        names = [names[i] for i in sorted(names)]
    stride = attrs.get("stride")
    return Checkpoint(config, list(names), _collect_state(pickled), source="ultralytics",
                      stride=[float(s) for s in stride] if isinstance(stride, torch.Tensor) else None)


def _collect_state(module: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    """Walk a pickled module tree (stand-ins or torch modules) by its ``_modules`` dicts; fp16
    tensors stay as stored, the model converts them to its own dtype when loading."""
    attrs = vars(module)
    state: dict[str, torch.Tensor] = {}
    non_persistent = attrs.get("_non_persistent_buffers_set", set())
    for kind in ("_parameters", "_buffers"):
        for name, tensor in (attrs.get(kind) or {}).items():
            if tensor is not None and name not in non_persistent:
                state[prefix + name] = tensor.detach()
    for name, child in (attrs.get("_modules") or {}).items():
        if child is not None:
            state.update(_collect_state(child, f"{prefix}{name}."))
    return state
