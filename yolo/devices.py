"""Turn a device string into a torch device, refusing what this machine does not have."""

from __future__ import annotations

import torch


def available_devices() -> list[str]:
    return ["cpu"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]


def resolve_device(spec: str) -> torch.device:
    """``cpu``, ``cuda``, ``cuda:N`` or a bare ``N`` (Ultralytics' ``--device 0``); never a silent
    fall-back to the CPU."""
    spec = f"cuda:{spec.strip()}" if spec.strip().isdigit() else spec
    try:
        device = torch.device(spec)
    except (RuntimeError, TypeError):
        raise ValueError(f"device: expected cpu, cuda, cuda:N or N, got {spec!r}") from None
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise ValueError(f"device: expected cpu, cuda, cuda:N or N, got {spec!r}")
    if not torch.cuda.is_available():
        raise ValueError(f"device {spec!r} requested but CUDA is not available here; "
                         f"available devices: {', '.join(available_devices())}")
    index = 0 if device.index is None else device.index
    if index >= torch.cuda.device_count():
        raise ValueError(f"device {spec!r} does not exist; available devices: {', '.join(available_devices())}")
    return torch.device("cuda", index)


def synchronizer(device: torch.device):
    """A call that waits for ``device``'s queued work (a GPU's), so a timestamp after it covers
    that work; it does nothing on a CPU, where work is done when the call returns."""
    device = torch.device(device)
    if device.type != "cuda":
        return _nothing_queued
    return lambda: torch.cuda.synchronize(device)


def _nothing_queued() -> None:
    pass
