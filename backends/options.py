"""How to load an inference backend's model, without importing torch (the runner builds these)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BackendOptions:
    """How to load a backend's model; built from the run's configuration (or python -m yolo's flags)."""

    weights: str | None
    preset: str = "yolov5n"
    device: str = "cpu"
    precision: str = "fp32"
    threads: int | None = None  # intra-op threads of the forward (None: the engine's default)
    batch_size: int = 1
    fuse: bool = True
    inplace: bool = False
    channels_last: bool = True
    module_timing: str = "none"  # none, layers, blocks, leaves
    timing_mode: str = "auto"
    keep_span_forwards: int = 0  # forwards whose per-module spans the trace keeps
    cuda_graphs: bool = False  # the forward captured and replayed as a CUDA graph per input shape
    pin_threads: bool = True  # OpenVINO: pin its threads to cores (off where processes share them)
