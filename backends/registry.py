"""The inference backends by name: what each runs on and needs, checked before a run starts, how
the start line, the environment and the report name it, whether the sweep tries it, and the
module that loads it, imported only by the processes that run it (this module imports no torch).

A new backend is one module with ``load(options) -> Backend`` (optionally ``prepare(options)``,
run once before the inference processes start, and ``ready_for_sweep(options)``) that calls
:func:`register` with its :class:`BackendSpec`, for instance from a plugin module named in
``YOLO_PIPELINE_PLUGINS`` (topology/plugins.py), which every process imports::

    register(BackendSpec("mine", "my_plugin", devices=("cpu",), engine="Mine", packages=("mine",)))

Everything here reads the registry when called, so a spec registered after this module was
imported counts everywhere."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from backends.optional import installed
from backends.options import BackendOptions

if TYPE_CHECKING:
    from backends.base import Backend

DEFAULT_BACKEND = "torch"  # what a run uses unless told; the sweep moves from it to the others


@dataclass(frozen=True)
class BackendSpec:
    """One backend, as every part of the tree outside its module sees it."""

    name: str  # what --backend takes
    module: str  # an importable module with load(options) -> Backend (a plugin's own module too)
    devices: tuple[str, ...] = ("cpu",)  # the device types it runs on
    requires: str | None = None  # a package it needs beyond requirements' always-imported ones
    engine: str = ""  # how the start line and the report name it ("PyTorch"); the name when empty
    mode: str = ""  # how the engine runs the model, said after its version ("eager")
    packages: tuple[str, ...] = ()  # distributions whose versions the run's environment lists; the first is the engine
    autocast: bool = False  # its bf16 is torch's autocast (the start line and the report say so)
    sweep: str = ""  # why a sweep trial moves to it from the default backend; "": the sweep never tries it
    device_tensors: bool = False  # takes frames as torch tensors on its device (--data-path device)

    @property
    def title(self) -> str:
        """The start line's words: "PyTorch eager", "OpenVINO"."""
        return " ".join(word for word in (self.engine or self.name, self.mode) if word)

    def label(self, environment: dict, devices: str, autocast: bool) -> str:
        """The report's words for what ran the forward: "PyTorch 2.5.1 eager with bf16 autocast on
        cpu", "OpenVINO 2025.3.0 on cpu". ``environment``: the run's (package versions);
        ``autocast``: the forwards ran in bf16 (said only where that is torch's autocast)."""
        version = environment.get(self.packages[0]) if self.packages else None
        words = [self.engine or self.name, version, self.mode, "with bf16 autocast" if autocast and self.autocast
                 else None, f"on {devices}"]
        return " ".join(word for word in words if word)


_BACKENDS: dict[str, BackendSpec] = {spec.name: spec for spec in (
    BackendSpec("torch", "backends.torch_backend", devices=("cpu", "cuda"), engine="PyTorch", mode="eager",
                packages=("torch", "torchvision"), autocast=True, device_tensors=True),
    BackendSpec("openvino", "backends.openvino", devices=("cpu",), requires="openvino", engine="OpenVINO",
                packages=("openvino",),
                sweep="OpenVINO's forward, less inference CPU per frame (the model converted once, cached)"),
)}


def register(spec: BackendSpec) -> BackendSpec:
    """Add ``spec`` (the same spec again is a no-op: a plugin may be imported twice); returns it.
    ValueError when another backend has its name."""
    known = _BACKENDS.get(spec.name)
    if known is not None and known != spec:
        raise ValueError(f"expected a new backend name, got {spec.name!r}, registered already as {known}")
    _BACKENDS[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    """Remove the backend ``name`` (a test's own); nothing happens when there is none."""
    _BACKENDS.pop(name, None)


def backend_names() -> tuple[str, ...]:
    """The registered backends' names, in the order they were registered."""
    return tuple(_BACKENDS)


class _Names(Sequence):
    """:func:`backend_names` as a constant to import: read when used, never a stale copy."""

    def __getitem__(self, index):
        return backend_names()[index]

    def __len__(self) -> int:
        return len(_BACKENDS)

    def __repr__(self) -> str:
        return repr(backend_names())


NAMES: Sequence[str] = _Names()


def backend_spec(name: str) -> BackendSpec:
    """The spec of ``name``; ValueError naming the known ones when there is none."""
    spec = _BACKENDS.get(name)
    if spec is None:
        raise ValueError(f"expected a backend of {', '.join(_BACKENDS)}, got {name!r}")
    return spec


def recorded_backend(name: str) -> BackendSpec:
    """The spec of the backend a run's record names: the registered one, or a bare spec that
    only names it (a plugin's backend where this process has not imported the plugin)."""
    return _BACKENDS.get(name) or BackendSpec(name, module="")


def check_backend(name: str, device_type: str) -> None:
    """ValueError naming what is wrong: an unknown backend, a device it does not run on, or a
    package it needs that is not installed."""
    spec = backend_spec(name)
    if device_type not in spec.devices:
        raise ValueError(f"{name} runs on the {' or '.join(d.upper() for d in spec.devices)} here; expected device "
                         f"{' or '.join(spec.devices)}, got {device_type} (use the torch backend on CUDA)")
    if spec.requires and not installed(spec.requires):
        raise ValueError(f"{name} is not installed (pip install -r requirements.txt installs the pinned version)")


def load_backend(name: str, options: BackendOptions) -> Backend:
    return importlib.import_module(backend_spec(name).module).load(options)


def prepare_backend(name: str, options: BackendOptions) -> str | None:
    """The backend's once-per-run preparation (OpenVINO: convert the model into its disk cache);
    returns what it did, in words, or None when it has none."""
    prepare = getattr(importlib.import_module(backend_spec(name).module), "prepare", None)
    return prepare(options) if prepare is not None else None


def backend_packages() -> tuple[str, ...]:
    """The distributions whose versions a run's environment lists for its backends, each once."""
    return tuple(dict.fromkeys(package for spec in _BACKENDS.values() for package in spec.packages))


def sweep_alternatives(device_type: str) -> list[BackendSpec]:
    """The backends a sweep may move to from the default one, on this device type."""
    return [spec for spec in _BACKENDS.values()
            if spec.sweep and spec.name != DEFAULT_BACKEND and device_type in spec.devices]


def ready_for_sweep(name: str, options: BackendOptions) -> bool:
    """Whether a sweep trial may use ``name`` now: its package installed and, where its module
    says (``ready_for_sweep(options)``: OpenVINO's converted model already cached), ready."""
    spec = backend_spec(name)
    if spec.requires and not installed(spec.requires):
        return False
    ready = getattr(importlib.import_module(spec.module), "ready_for_sweep", None)
    return ready(options) if ready is not None else True
