"""The project's own YOLOv5 run by OpenVINO on the CPU, callable like the torch model.

The torch model (this project's, loaded from the weights) is converted once with
``openvino.convert_model`` (Detect built out of place: the in-place decode does not convert), with
dynamic batch, height and width, and saved to a disk cache keyed by the weights' hash, the model
options and the OpenVINO version; each input shape then gets its own compiled model, compiled
once. A cache entry is trusted only when the SHA-256 of its files matches the one written beside
them after a complete save; anything else is rebuilt.

Per-module times come from OpenVINO's own counters (``PERF_COUNT``): each executed node is named
after the torch module it came from (``__module.model.2.cv1.conv/aten::_convolution/...``), so
its time is added to every timed module name that is a prefix of that path, and fed to a
``Recorder`` with the same names, types and nesting that ``TimedModule`` would record. Nodes that
carry no module path (reorders, the decode's gathers) fall into the residual row.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from backends.base import Backend
from backends.optional import import_optional
from backends.options import BackendOptions
from yolo.checkpoint import load_model
from yolo.model import TIMING_SELECTIONS
from yolo.precision import Precision
from yolo.timing import Recorder, select_modules

log = logging.getLogger(__name__)

OPENVINO_PRECISION_HINTS = {"fp32": "f32", "bf16": "bf16"}
MAX_COMPILED_SHAPES = 16
MODULE_PATH = re.compile(r"__module\.([\w.]+?)(?:/|$)")
CONVERSION_SHAPE = (1, 3, 640, 640)
PIN_THREADS_NOTE = """OpenVINO pins its threads to cores by default, each process on its own: two
one-thread processes then share one core while the other idles (measured on 2 vCPUs: each
process got half a core, 21 fps together against 44 fps unpinned). A process that shares the
cores with others (the pipeline's inference workers) passes ``pin_threads=False``."""


class OpenVinoError(RuntimeError):
    """OpenVINO is missing, refuses the request, or cannot convert the model; the message says which."""


def import_openvino():
    return import_optional("openvino", OpenVinoError, "backend openvino: the openvino package is not installed "
                           "(pip install -r requirements.txt installs the pinned version)")


def cache_dir() -> Path:
    """$YOLO_PIPELINE_CACHE, else $XDG_CACHE_HOME/yolo-pipeline, else ~/.cache/yolo-pipeline."""
    if os.environ.get("YOLO_PIPELINE_CACHE"):
        return Path(os.environ["YOLO_PIPELINE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "yolo-pipeline"


def cache_key(weights: str | None, preset: str, fuse: bool, ov_version: str) -> str:
    """What the converted model depends on: the weights' bytes (or the random preset, seed 0),
    the model options, and the converter's version."""
    digest = hashlib.sha256()
    if weights:
        with open(weights, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    else:
        digest.update(f"random:{preset}:seed0".encode())
    digest.update(json.dumps({"fuse": fuse, "detect": "out-of-place", "openvino": ov_version}).encode())
    return digest.hexdigest()[:24]


def _files_digest(xml: Path, weights_bin: Path) -> str:
    digest = hashlib.sha256()
    for path in (xml, weights_bin):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def converted_model_path(weights: str | None, *, preset: str = "yolov5n", fuse: bool = True,
                         root: Path | None = None) -> tuple[Path, bool]:
    """(the cached OpenVINO IR .xml of this model, whether it was converted now). A missing,
    partial or corrupt entry is converted again; the entry is written to temporary names and
    renamed, its digest last, so a crash mid-save leaves nothing that is trusted."""
    ov = import_openvino()
    folder = _cache_folder(weights, preset, fuse, root)
    xml, weights_bin, manifest = folder / "model.xml", folder / "model.bin", folder / "sha256"
    if cached_model_path(weights, preset=preset, fuse=fuse, root=root, warn=True):
        return xml, False
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    ov_model = convert(load_model(weights or None, preset=preset, fuse=fuse, inplace=False, channels_last=False))
    tmp_xml = folder / f"model.{os.getpid()}.tmp.xml"
    ov.save_model(ov_model, str(tmp_xml), compress_to_fp16=False)
    os.replace(tmp_xml.with_suffix(".bin"), weights_bin)
    os.replace(tmp_xml, xml)
    tmp_manifest = folder / f"sha256.{os.getpid()}.tmp"
    tmp_manifest.write_text(_files_digest(xml, weights_bin))
    os.replace(tmp_manifest, manifest)
    log.info("converted the model for OpenVINO in %.1f s (cached in %s)", time.perf_counter() - t0, folder)
    return xml, True


def _cache_folder(weights: str | None, preset: str, fuse: bool, root: Path | None) -> Path:
    version = import_openvino().__version__
    return (root or cache_dir()) / "openvino" / cache_key(weights, preset, fuse, version)


def cached_model_path(weights: str | None, *, preset: str = "yolov5n", fuse: bool = True, root: Path | None = None,
                      warn: bool = False) -> Path | None:
    """The cached OpenVINO IR .xml of this model when a complete entry matches its digest; None
    otherwise (nothing is converted here). ``warn``: log an entry that does not match."""
    folder = _cache_folder(weights, preset, fuse, root)
    xml, weights_bin, manifest = folder / "model.xml", folder / "model.bin", folder / "sha256"
    try:
        if manifest.read_text().strip() == _files_digest(xml, weights_bin):
            return xml
    except OSError:
        return None  # not there (yet)
    if warn:
        log.warning("OpenVINO cache entry %s does not match its digest: converting again", folder)
    return None


def convert(model: torch.nn.Module):
    """``openvino.convert_model`` of an eval-mode, out-of-place-Detect YOLOv5, dynamic N, H, W."""
    ov = import_openvino()
    model.set_inplace(False)  # the in-place decode's aten::mul_ does not convert
    with torch.inference_mode():
        try:
            return ov.convert_model(model, example_input=torch.zeros(CONVERSION_SHAPE),
                                    input=[ov.PartialShape([-1, 3, -1, -1])])
        except Exception as exc:  # the converter raises its own exception types
            raise OpenVinoError(f"backend openvino: cannot convert the model: {exc}") from exc


class CounterTiming:
    """Module times of an OpenVINO forward from its PERF_COUNT counters, under the names,
    types and nesting ``TimedModule`` gives the same torch model (``selected`` names)."""

    def __init__(self, torch_model: torch.nn.Module, selected: list[str], keep_span_forwards: int = 0):
        self.recorder = Recorder("openvino-counters", keep_span_forwards=keep_span_forwards)
        modules = dict(torch_model.named_modules())
        chosen = set(selected)
        for name in selected:
            module = modules[name]
            self.recorder.register(name, type(module).__name__, sum(p.numel() for p in module.parameters()))
            self.recorder.infos[name].outermost = not any(a in chosen for a in _ancestors(name))
        self._names_of_path: dict[str, list[str]] = {}
        self._chosen = chosen

    def names_of(self, path: str) -> list[str]:
        """The timed names a node with module path ``path`` runs inside (itself and its ancestors)."""
        if path not in self._names_of_path:
            self._names_of_path[path] = [n for n in (path, *_ancestors(path)) if n in self._chosen]
        return self._names_of_path[path]

    def add(self, profiling: list[Any], forward_ms: float, started_s: float) -> None:
        """One forward's counters. Their sum can exceed the forward's wall time (measured here,
        the node counters often read 5-15 % more on one thread): then every time is scaled to
        the wall time, so that the outermost rows and the residual still add up to the forward."""
        times: dict[str, float] = {}
        total_ms = 0.0
        for node in profiling:
            ms = node.real_time.total_seconds() * 1e3
            total_ms += ms
            match = MODULE_PATH.search(node.node_name)
            if match is None:
                continue
            for name in self.names_of(match.group(1)):
                times[name] = times.get(name, 0.0) + ms
        if total_ms > forward_ms > 0:
            times = {name: ms * forward_ms / total_ms for name, ms in times.items()}
        self.recorder.add_forward(forward_ms, times, started_s)


def _ancestors(path: str) -> list[str]:
    parts = path.split(".")
    return [".".join(parts[:i]) for i in range(len(parts) - 1, 0, -1)]


class OpenVinoModel:
    """The converted model, called like the torch one: Tensor[N, 3, H, W] float32 in [0, 1] ->
    Tensor[N, A, 5 + classes] (boxes decoded), on the CPU."""

    def __init__(self, weights: str | None, *, preset: str = "yolov5n", precision: Precision = "fp32",
                 threads: int | None = None, fuse: bool = True, timing: str = "none",
                 keep_span_forwards: int = 0, pin_threads: bool = True):
        if precision not in OPENVINO_PRECISION_HINTS:
            raise OpenVinoError(f"backend openvino: expected precision fp32 or bf16, got {precision!r}")
        ov = import_openvino()
        self.torch_model = load_model(weights or None, preset=preset, fuse=fuse, inplace=False, channels_last=False)
        self.names, self.max_stride = self.torch_model.names, self.torch_model.max_stride
        self.precision, self.input_dtype = precision, torch.float32
        self.xml, self.converted_now = converted_model_path(weights, preset=preset, fuse=fuse)
        self.core = ov.Core()
        self.base = self.core.read_model(str(self.xml))
        self.config: dict[str, Any] = {"INFERENCE_PRECISION_HINT": OPENVINO_PRECISION_HINTS[precision],
                                       "PERF_COUNT": timing != "none"}
        if threads:
            self.config["INFERENCE_NUM_THREADS"] = threads
        if not pin_threads:  # see PIN_THREADS_NOTE
            self.config["ENABLE_CPU_PINNING"] = False
        self.timing = self._timing(timing, keep_span_forwards)
        self.requests: dict[tuple, Any] = {}

    def _timing(self, selection: str, keep_span_forwards: int) -> CounterTiming | None:
        if selection == "none":
            return None
        chosen = select_modules(self.torch_model, **TIMING_SELECTIONS[selection])
        return CounterTiming(self.torch_model, chosen, keep_span_forwards)

    def num_params(self) -> int:
        return self.torch_model.num_params()

    def _request(self, shape: tuple):
        if shape not in self.requests:
            if len(self.requests) >= MAX_COMPILED_SHAPES:
                self.requests.pop(next(iter(self.requests)))
            model = self.base.clone()
            model.reshape({0: list(shape)})
            self.requests[shape] = self.core.compile_model(model, "CPU", self.config).create_infer_request()
        return self.requests[shape]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or x.ndim != 4 or x.device.type != "cpu":
            raise ValueError(f"expected a float32 CPU tensor of shape (N, 3, H, W), got {x.dtype} {tuple(x.shape)} "
                             f"on {x.device}")
        request = self._request(tuple(x.shape))
        started = time.perf_counter()
        request.infer({0: np.ascontiguousarray(x.numpy())})
        forward_ms = (time.perf_counter() - started) * 1e3
        if self.timing is not None:
            self.timing.add(request.get_profiling_info(), forward_ms, started)
        return torch.from_numpy(request.get_output_tensor(0).data.copy())

    def log_line(self) -> str:
        version = import_openvino().__version__.split("-")[0]
        return f"OpenVINO {version} ({self.config.get('INFERENCE_NUM_THREADS', 'all')} threads, IR {self.xml.parent.name})"


class OpenVinoBackend(Backend):
    name = "openvino"

    def engine_words(self) -> str:
        return self.model.log_line()


def load(options: BackendOptions) -> OpenVinoBackend:
    model = OpenVinoModel(options.weights, preset=options.preset, precision=options.precision,
                          threads=options.threads, fuse=options.fuse, timing=options.module_timing,
                          keep_span_forwards=options.keep_span_forwards, pin_threads=options.pin_threads)
    return OpenVinoBackend(model, model.timing, options)


def prepare(options: BackendOptions) -> str:
    """Convert the model once, before the inference processes start (seconds each, all at once
    otherwise), into the disk cache; a cached conversion is only checked."""
    path, converted = converted_model_path(options.weights, preset=options.preset, fuse=options.fuse)
    return f"OpenVINO model {'converted and cached' if converted else 'from the cache'}: {path.parent}"


def ready_for_sweep(options: BackendOptions) -> bool:
    """Whether a sweep trial may move to OpenVINO: only with the model's conversion cached.
    Converting takes tens of seconds, which one trial would spend out of the budget; one run
    with --backend openvino converts it for every later sweep."""
    if cached_model_path(options.weights, preset=options.preset, fuse=options.fuse) is not None:
        return True
    log.info("sweep: --backend openvino is not tried: its converted model is not cached yet (one run with "
             "--backend openvino converts it)")
    return False
