"""The machine a run ran on, as every part sees it: the runner measures it, the report reads it
back from the run, and the sweep bounds its settings by it."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Machine:
    cores: int  # usable by this process (its affinity mask)
    device_type: str = "cpu"  # where inference runs: "cpu" | "cuda"
    bf16: bool = False  # the CPU computes bfloat16 natively (avx512_bf16 or amx_bf16)
    gpus: int = 0  # the GPUs inference runs on (0 on a CPU run)
    openvino: bool = False  # the OpenVINO backend can run here (installed; inference on the CPU)
    forward_probe: dict | None = None  # supervisor.forward_probe's measurement, for the backend lever

    @property
    def on_cuda(self) -> bool:
        return self.gpus > 0

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, machine: dict, *, cores: int | None = None, device: str = "cpu") -> Machine:
        """A run's machine as its record holds it; ``cores`` and ``device`` (the configuration's)
        stand in for what an older record lacks."""
        device_type = machine.get("device_type") or ("cuda" if device.startswith("cuda") else "cpu")
        gpus = machine.get("gpus", len(device.split(",")) if device_type == "cuda" else 0)
        return cls(cores=machine.get("cores") or cores or 1, device_type=device_type,
                   bf16=bool(machine.get("bf16", False)), gpus=gpus, openvino=bool(machine.get("openvino", False)),
                   forward_probe=machine.get("forward_probe"))


def usable_cores() -> int:
    """The cores this process may run on: its affinity mask (as ``taskset``, a cgroup cpuset or a
    container's CPU set leave it), not the host's count, so worker counts follow what we get."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # no affinity masks on this platform
        return os.cpu_count() or 1
