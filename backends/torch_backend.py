"""The torch backend: the project's own YOLOv5 in eager mode, every selected module wrapped by
TimedModule (yolo.timing) for its per-module times."""

from __future__ import annotations

import torch

from backends.base import Backend
from backends.options import BackendOptions
from yolo.checkpoint import load_model
from yolo.model import TIMING_SELECTIONS
from yolo.timing import default_timing_mode, instrument


class TorchBackend(Backend):
    name = "torch"


def load(options: BackendOptions) -> TorchBackend:
    device = torch.device(options.device)
    model = load_model(options.weights, preset=options.preset, device=device, precision=options.precision,
                       fuse=options.fuse, inplace=options.inplace, channels_last=options.channels_last)
    return TorchBackend(model, instrument_model(model, options, device), options)


def instrument_model(model: torch.nn.Module, options: BackendOptions, device: torch.device):
    if options.module_timing == "none":
        return None
    mode = default_timing_mode(device) if options.timing_mode == "auto" else options.timing_mode
    return instrument(model, mode=mode, keep_span_forwards=options.keep_span_forwards,
                      **TIMING_SELECTIONS[options.module_timing])
