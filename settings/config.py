"""The run configuration: ``config.toml`` defaults, overridden by command-line flags, checked
once here so every stage can trust it."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tomllib
from dataclasses import dataclass, field
from typing import Any

from backends.registry import NAMES as BACKEND_NAMES

# TOML section -> the RunConfig fields it may hold.
SECTIONS: dict[str, tuple[str, ...]] = {
    "model": ("weights", "preset", "backend", "fuse", "inplace", "half", "channels_last"),
    "detect": ("imgsz", "rect", "conf_thres", "iou_thres", "max_det", "classes", "agnostic_nms"),
    "source": ("source", "frames", "duration", "warmup", "synthetic_count", "vid_stride", "decode", "max_pixels"),
    "pipeline": ("device", "workers", "pre_workers", "infer_workers", "post_workers", "infer_threads",
                 "batch_size", "max_wait_ms", "prefetch", "module_timing", "timing_mode",
                 "trace_module_forwards", "trace_max_frames", "max_restarts", "heartbeat_timeout_s"),
    "output": ("results", "name", "exist_ok", "save_images", "save_txt", "save_conf", "save_crop", "line_thickness",
               "hide_labels", "hide_conf", "log_level", "progress", "allow_failures", "json"),
    "transport": ("transport", "tcp_host", "tcp_base_port"),
}
MODULE_TIMING = ("none", "layers", "blocks", "leaves")
TIMING_MODES = ("auto", "cpu", "cuda-sync", "cuda-events")
LOG_LEVELS = ("debug", "info", "warning", "error")


MAX_LINE_THICKNESS = 100
MAX_FRAMES = 100_000_000  # the collector keeps a byte per frame id; use --duration for longer runs


# The runner's flag for a setting is ``--`` and its name with dashes; these switches turn one off.
SWITCHES_OFF = {"rect": "--square", "fuse": "--no-fuse", "channels_last": "--no-channels-last",
                "inplace": "--out-of-place", "progress": "--no-progress"}


def flag_of(field_name: str, value: Any = True) -> str:
    """The runner's flag that sets ``field_name`` to ``value``: ``--batch-size``, ``--square`` (rect off)."""
    if value is False and field_name in SWITCHES_OFF:
        return SWITCHES_OFF[field_name]
    return "--" + field_name.replace("_", "-")


class ConfigError(ValueError):
    """A bad configuration key or value; the message names it."""


@dataclass(frozen=True)
class RunConfig:
    weights: str = ""
    preset: str = "yolov5n"
    backend: str = "torch"
    fuse: bool = True
    inplace: bool = True
    half: bool = False
    channels_last: bool = True
    imgsz: int = 640
    rect: bool = True
    conf_thres: float = 0.25
    iou_thres: float = 0.45
    max_det: int = 1000
    classes: tuple[int, ...] = ()
    agnostic_nms: bool = False
    source: str = "synthetic"
    frames: int = 0  # 0: one pass over the source
    duration: float = 0.0  # seconds from the first frame, then drain; 0: off
    warmup: int = 0
    synthetic_count: int = 64
    vid_stride: int = 1  # read every N-th frame of videos and streams
    decode: str = "full"  # full | reduced (JPEG at 1/2, 1/4, 1/8 when the source is that much larger)
    max_pixels: int = 100_000_000  # an image over this is a failed frame, refused from its header
    device: str = "cpu"  # cpu, cuda, cuda:N, or a comma-separated list of them
    workers: int = 0  # 0: one per CPU core
    pre_workers: int = 0  # 0: --workers
    infer_workers: int = 0  # 0: one per GPU; on CPU one per core
    post_workers: int = 0  # 0: --workers
    infer_threads: int = 0  # 0: 1 on CPU (measured best here), 1 per process on CUDA
    batch_size: int = 1
    max_wait_ms: float = 5.0
    prefetch: int = 2  # batches of credit each consumer grants upstream
    module_timing: str = "layers"
    timing_mode: str = "auto"
    trace_module_forwards: int = 20
    trace_max_frames: int = 5000  # frames whose spans go into trace.json; 0 = all
    max_restarts: int = 3  # restarts per stage (pre, infer, post) of workers that die or hang
    heartbeat_timeout_s: float = 5.0  # a process silent this long is handled as dead
    results: str = "results"
    name: str = ""  # run folder name; "" = a timestamp
    exist_ok: bool = False  # reuse an existing run folder of that name
    save_images: str = "all"  # all | none | N (every N-th frame)
    save_txt: bool = False  # YOLO label files in labels/
    save_conf: bool = False  # with the score in each label line
    save_crop: bool = False  # each box cut out of the saved frames, in crops/<class>/
    line_thickness: int = 0  # box line width in pixels; 0: scaled with the image
    hide_labels: bool = False  # boxes without "name score"
    hide_conf: bool = False  # labels without the score
    log_level: str = "info"
    progress: bool = True
    allow_failures: bool = False  # exit 0, not 3, when some frames failed
    json: bool = False  # print one JSON summary on stdout, logs on stderr
    transport: str = "ipc"  # ipc | tcp
    tcp_host: str = "127.0.0.1"
    tcp_base_port: int = 5550
    devices: tuple[str, ...] = field(default=(), compare=False)  # resolved from device

    def __post_init__(self) -> None:
        _check(self.imgsz > 0 and self.imgsz % 32 == 0, "imgsz", "a positive multiple of 32", self.imgsz)
        for name in ("conf_thres", "iou_thres"):
            value = getattr(self, name)
            _check(0.0 <= value <= 1.0, name, "a value in [0, 1]", value)
        _check(self.max_det > 0, "max_det", "> 0", self.max_det)
        _check(all(isinstance(c, int) and c >= 0 for c in self.classes), "classes", "class ids >= 0",
               list(self.classes))
        _check(0 <= self.frames <= MAX_FRAMES, "frames", f"between 0 (one pass) and {MAX_FRAMES}", self.frames)
        _check(self.warmup >= 0, "warmup", ">= 0", self.warmup)
        _check(self.duration >= 0, "duration", ">= 0 seconds (0 = off)", self.duration)
        _check(self.vid_stride >= 1, "vid_stride", ">= 1", self.vid_stride)
        _check(self.decode in ("full", "reduced"), "decode", "'full' or 'reduced'", self.decode)
        _check(self.backend in BACKEND_NAMES, "backend", f"one of {BACKEND_NAMES}", self.backend)
        _check(self.max_pixels > 0, "max_pixels", "> 0", self.max_pixels)
        _check(self.name == "" or (self.name not in (".", "..", "latest") and "/" not in self.name
                                   and "\\" not in self.name), "name", "a folder name without '/' (not 'latest')",
               self.name)
        _check(self.save_txt or not self.save_conf, "save_conf", "save_txt as well (scores go into label files)",
               self.save_conf)
        _check(0 <= self.line_thickness <= MAX_LINE_THICKNESS, "line_thickness",
               f"0 (scaled with the image) to {MAX_LINE_THICKNESS} pixels", self.line_thickness)
        _check(self.synthetic_count > 0, "synthetic_count", "> 0", self.synthetic_count)
        for name in ("workers", "pre_workers", "infer_workers", "post_workers", "infer_threads"):
            _check(getattr(self, name) >= 0, name, ">= 0 (0 = automatic)", getattr(self, name))
        _check(self.batch_size >= 1, "batch_size", ">= 1", self.batch_size)
        _check(self.max_wait_ms >= 0, "max_wait_ms", ">= 0", self.max_wait_ms)
        _check(self.prefetch >= 1, "prefetch", ">= 1", self.prefetch)
        _check(self.module_timing in MODULE_TIMING, "module_timing", f"one of {MODULE_TIMING}", self.module_timing)
        _check(self.timing_mode in TIMING_MODES, "timing_mode", f"one of {TIMING_MODES}", self.timing_mode)
        _check(self.max_restarts >= 0, "max_restarts", ">= 0", self.max_restarts)
        _check(self.heartbeat_timeout_s >= 1.0, "heartbeat_timeout_s", ">= 1 (heartbeats come every 0.5 s)",
               self.heartbeat_timeout_s)
        _check(self.trace_max_frames >= 0, "trace_max_frames", ">= 0 (0 = all)", self.trace_max_frames)
        _check(self.trace_module_forwards >= 0, "trace_module_forwards", ">= 0", self.trace_module_forwards)
        _check(self.log_level in LOG_LEVELS, "log_level", f"one of {LOG_LEVELS}", self.log_level)
        _check(self.transport in ("ipc", "tcp"), "transport", "'ipc' or 'tcp'", self.transport)
        _check(1024 <= self.tcp_base_port <= 65000, "tcp_base_port", "a port in [1024, 65000]", self.tcp_base_port)
        save = self.save_images
        _check(save in ("all", "none") or (save.isdigit() and int(save) > 0), "save_images",
               "'all', 'none' or a positive integer N (every N-th frame)", save)
        _check(bool(self.preset), "preset", "a model preset name", self.preset)

    @property
    def save_every(self) -> int:
        """Save every N-th frame; 0 means none."""
        return {"all": 1, "none": 0}[self.save_images] if self.save_images in ("all", "none") \
            else int(self.save_images)

    def credit_per_producer(self) -> int:
        """Frames each inference worker lets every preprocess worker send ahead: ``prefetch``
        batches shared among the producers (at least one each)."""
        return max(1, math.ceil(self.batch_size * self.prefetch / self.pre_workers))

    def backend_options(self, device: str, precision: str, threads: int):
        """How an inference process loads this run's backend (backends.registry)."""
        from backends.options import BackendOptions
        return BackendOptions(weights=self.weights or None, preset=self.preset, device=device, precision=precision,
                              threads=threads, batch_size=self.batch_size, fuse=self.fuse, inplace=self.inplace,
                              channels_last=self.channels_last, module_timing=self.module_timing,
                              timing_mode=self.timing_mode, keep_span_forwards=self.trace_module_forwards,
                              pin_threads=False)  # several inference processes share the cores

    def detect_options(self):
        """The options of yolo.detect that inference and postprocess share."""
        from yolo.detect import DetectOptions  # imported here: the runner reads configs without torch
        return DetectOptions(imgsz=self.imgsz, rect=self.rect, conf_thres=self.conf_thres,
                             iou_thres=self.iou_thres, classes=tuple(self.classes) or None,
                             agnostic=self.agnostic_nms, max_det=self.max_det)

    def draw_options(self):
        """How boxes are drawn, for postprocess and the collector's video frames."""
        from yolo.draw import DrawOptions  # imported here: the runner reads configs without OpenCV
        return DrawOptions(line_width=self.line_thickness or None, hide_labels=self.hide_labels,
                           hide_conf=self.hide_conf)

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["classes"] = list(self.classes)
        d["devices"] = list(self.devices)
        return d


def _check(ok: bool, name: str, expected: str, got: Any) -> None:
    if not ok:
        raise ConfigError(f"config {name}: expected {expected}, got {got!r}")


FIELD_TYPES = {f.name: f.type for f in dataclasses.fields(RunConfig)}


def _coerce(name: str, value: Any) -> Any:
    """Check a TOML or flag value against the field's type; TOML gives real types already."""
    kind = FIELD_TYPES[name]
    if kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"config {name}: expected true or false, got {value!r}")
        return value
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"config {name}: expected an integer, got {value!r}")
        return value
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"config {name}: expected a number, got {value!r}")
        return float(value)
    if kind == "str":
        if isinstance(value, int) and not isinstance(value, bool) and name == "save_images":
            return str(value)
        if not isinstance(value, str):
            raise ConfigError(f"config {name}: expected a string, got {value!r}")
        return value
    if name == "classes":
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"config classes: expected a list of class ids, got {value!r}")
        return tuple(value)
    raise ConfigError(f"config {name}: cannot be set")


def read_toml(path: str) -> dict[str, Any]:
    """Flatten a config file's sections into RunConfig field values, refusing unknown keys."""
    if not os.path.isfile(path):
        raise ConfigError(f"config file not found: {path}")
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:  # a binary file fails as UTF-8 first
        raise ConfigError(f"config file {path}: not valid TOML ({exc})") from None
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot read it ({exc.strerror})") from None
    values: dict[str, Any] = {}
    for section, table in data.items():
        if section not in SECTIONS:
            raise ConfigError(f"config file {path}: unknown section [{section}], expected one of {list(SECTIONS)}")
        if not isinstance(table, dict):
            raise ConfigError(f"config file {path}: expected [{section}] to be a table, got {table!r}")
        for key, value in table.items():
            if key not in SECTIONS[section]:
                raise ConfigError(f"config file {path}: unknown key {key!r} in [{section}], "
                                  f"expected one of {list(SECTIONS[section])}")
            values[key] = _coerce(key, value)
    return values


def build_config(toml_values: dict[str, Any], overrides: dict[str, Any]) -> RunConfig:
    """Defaults < config file < flags; then the one validation."""
    values = dict(toml_values)
    for key, value in overrides.items():
        if value is not None:
            values[key] = _coerce(key, value)
    try:
        return RunConfig(**values)
    except TypeError as exc:
        raise ConfigError(str(exc)) from None


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        # A JSON string is a TOML basic string, once astral characters stay raw (JSON would write
        # surrogate pairs, which TOML refuses) and DEL is escaped (TOML refuses it raw).
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise ConfigError(f"config: expected a bool, number, string or list to write, got {value!r}")


def config_toml(cfg: RunConfig, heading: str = "") -> str:
    """Every key of ``cfg`` as a config file that ``read_toml`` reads back into the same values;
    ``heading`` (one or more lines) goes first as comments."""
    lines = [f"# {line}" for line in heading.splitlines()]
    for section, keys in SECTIONS.items():
        lines += ["", f"[{section}]"]
        lines += [f"{key} = {_toml_value(getattr(cfg, key))}" for key in keys]
    return "\n".join(lines).lstrip("\n") + "\n"
