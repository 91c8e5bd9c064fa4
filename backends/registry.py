"""The inference backends by name: what each runs on and needs, checked before a run starts,
and the module that loads it, imported only by the processes that run it (this module imports
no torch). A new backend is one
module with ``load(options) -> Backend`` (and, if its model is converted once per run,
``prepare(options)``) plus one entry here."""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from typing import TYPE_CHECKING

from backends.options import BackendOptions

if TYPE_CHECKING:
    from backends.base import Backend


@dataclass(frozen=True)
class BackendSpec:
    name: str
    module: str
    devices: tuple[str, ...]  # the device types it runs on
    requires: str | None = None  # a package it needs beyond requirements' always-imported ones


BACKENDS = {
    "torch": BackendSpec("torch", "backends.torch_backend", devices=("cpu", "cuda")),
    "openvino": BackendSpec("openvino", "backends.openvino", devices=("cpu",), requires="openvino"),
}
NAMES = tuple(BACKENDS)


def check_backend(name: str, device_type: str) -> None:
    """ValueError naming what is wrong: an unknown backend, a device it does not run on, or a
    package it needs that is not installed."""
    spec = BACKENDS.get(name)
    if spec is None:
        raise ValueError(f"expected a backend of {', '.join(NAMES)}, got {name!r}")
    if device_type not in spec.devices:
        raise ValueError(f"{name} runs on the {' or '.join(d.upper() for d in spec.devices)} here; expected device "
                         f"{' or '.join(spec.devices)}, got {device_type} (use the torch backend on CUDA)")
    if spec.requires and importlib.util.find_spec(spec.requires) is None:
        raise ValueError(f"{name} is not installed (pip install -r requirements.txt installs the pinned version)")


def load_backend(name: str, options: BackendOptions) -> Backend:
    return importlib.import_module(BACKENDS[name].module).load(options)


def prepare_backend(name: str, options: BackendOptions) -> str | None:
    """The backend's once-per-run preparation (OpenVINO: convert the model into its disk cache);
    returns what it did, in words, or None when it has none."""
    prepare = getattr(importlib.import_module(BACKENDS[name].module), "prepare", None)
    return prepare(options) if prepare is not None else None
