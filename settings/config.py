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

from backends import registry
from settings.declare import Switch, own_flag, sections, setting, switches_off

MODULE_TIMING = ("none", "layers", "blocks", "leaves")
TIMING_MODES = ("auto", "cpu", "cuda-sync", "cuda-events")
LOG_LEVELS = ("debug", "info", "warning", "error")
DATA_PATHS = ("auto", "host", "device")


MAX_LINE_THICKNESS = 100
MAX_FRAMES = 100_000_000  # the collector keeps a byte per frame id; use --duration for longer runs


def backend_names() -> tuple[str, ...]:
    """The backends registered now: a plugin may have added one since this module was imported."""
    return registry.backend_names()


class ConfigError(ValueError):
    """A bad configuration key or value; the message names it."""


@dataclass(frozen=True)
class RunConfig:
    """Every setting of a run, each declared once (settings/declare.py): its default, which
    config.toml must repeat, its section there, and its flags with their help."""

    weights: str = setting("", "model", "YOLOv5 checkpoint .pt (without it detections are meaningless; timings are "
                           "valid)", shown="none: a random-weight --preset")
    preset: str = setting("yolov5n", "model", "yolov5n/s/m/l/x built with random weights when --weights is empty, "
                          "or 'none' (no model)")
    backend: str = setting("torch", "model", "what runs the forward: torch, or OpenVINO on the CPU (the model "
                           "converted once, cached on disk)", choices=backend_names)
    fuse: bool = setting(True, "model", flag=False, switches=(
        Switch("--no-fuse", False, "keep BatchNorm separate (default: folded into the convs)"),))
    inplace: bool = setting(True, "model", flag=False, switches=(
        Switch("--out-of-place", False, "decode boxes in Detect without in-place tensor writes, as an ONNX export "
               "needs; same boxes, a little slower (default: in place)"),))
    half: bool = setting(False, "model", "fp16 on CUDA, bfloat16 on a CPU that has it")
    channels_last: bool = setting(True, "model", flag=False, switches=(
        Switch("--no-channels-last", False, "keep NCHW weights (default: NHWC, faster on CPU)"),))
    imgsz: int = setting(640, "detect", "letterbox size (pixels, a multiple of 32)", aliases=("--img", "--img-size"))
    rect: bool = setting(True, "detect", "long side to imgsz, short side to a multiple of 32",
                         switches=(Switch("--square", False, "fixed imgsz x imgsz letterbox"),))
    conf_thres: float = setting(0.25, "detect", "confidence threshold", aliases=("--conf",))
    iou_thres: float = setting(0.45, "detect", "NMS IoU threshold", aliases=("--iou",))
    max_det: int = setting(1000, "detect", "maximum detections per image")
    classes: tuple[int, ...] = setting((), "detect", "keep only these class ids")
    agnostic_nms: bool = setting(False, "detect", "NMS across classes")
    source: str = setting("synthetic", "source", "image, folder (recursive), glob, video, .txt list, URL, camera "
                          "index, or 'synthetic'")
    frames: int = setting(0, "source", "stop after N frames, looping the source if needed (0: one pass)")
    duration: float = setting(0.0, "source", "run for S seconds from the first frame, then finish (0: off)")
    warmup: int = setting(0, "source", "first N frames excluded from statistics")
    synthetic_count: int = setting(64, "source", "frames in one pass of the synthetic source")
    vid_stride: int = setting(1, "source", "read every N-th frame of videos and streams")
    decode: str = setting("full", "source", "full, or reduced (JPEG decoded at 1/2, 1/4, 1/8 when that much larger)")
    max_pixels: int = setting(100_000_000, "source", "images with more pixels are failed frames, refused before "
                              "decoding")
    device: str = setting("cpu", "pipeline", "cpu, cuda, cuda:N, N, or a list such as cuda:0,cuda:1 or 0,1 (a bare N "
                          "is cuda:N); with --ray also auto (cuda on a node with a GPU, else cpu)")
    data_path: str = setting("auto", "pipeline", "where a frame's pixels live from decode to encode: host (numpy and "
                             "OpenCV in the preprocess and postprocess workers), device (torch tensors on --device, "
                             "decoded, letterboxed, suppressed, drawn and JPEG-encoded there by the inference "
                             "workers), or auto (device with CUDA, else host)", choices=lambda: DATA_PATHS)
    workers: int = setting(0, "pipeline", "default for --pre-workers and --post-workers (0: one per core)")
    pre_workers: int = setting(0, "pipeline", "source + preprocess processes (0: --workers)")
    infer_workers: int = setting(0, "pipeline", "inference processes (0: one per GPU, one per core on CPU)")
    post_workers: int = setting(0, "pipeline", "NMS + drawing processes (0: --workers)")
    infer_threads: int = setting(0, "pipeline", "torch threads per inference process (0: 1)")
    batch_size: int = setting(1, "pipeline", "frames per inference batch (same letterboxed shape)")
    max_wait_ms: float = setting(5.0, "pipeline", "longest wait for a full batch")
    prefetch: int = setting(2, "pipeline", "how many batches each worker may have waiting for it from each worker "
                            "upstream: more rides over short stalls, costs memory and latency")
    module_timing: str = setting("layers", "pipeline", "time the model per part: none; layers (each of model.0 ... "
                                 "model.24); blocks (Conv, C3, SPPF, Detect, nested); leaves (every innermost layer: "
                                 "each Conv2d, BatchNorm, SiLU)")
    cuda_graphs: bool = setting(False, "pipeline", "replay the forward as a CUDA graph per input shape (fewer "
                                "kernel launches: batch 1 is bound by them); per-module timing is off with it")
    timing_mode: str = setting("auto", "pipeline", "auto, cpu, cuda-sync or cuda-events")
    # Set in a config file only: forwards and frames whose spans go into trace.json (0 frames: all).
    trace_module_forwards: int = setting(20, "pipeline", flag=False)
    trace_max_frames: int = setting(5000, "pipeline", flag=False)
    max_restarts: int = setting(3, "pipeline", "restarts per stage of workers that die or hang")
    heartbeat_timeout_s: float = setting(5.0, "pipeline", "a process silent this long is handled as dead")
    results: str = setting("results", "output", "folder of run folders", aliases=("--project",))
    name: str = setting("", "output", "run folder name; if it exists, name2, name3, ... as detect.py does",
                        shown="a timestamp")
    exist_ok: bool = setting(False, "output", "reuse the run folder of that name; what a run writes there (images, "
                             "labels, crops, reports) is removed first")
    # A cluster node's share of a run whose outputs go to a store (cluster/node.py): its run folder
    # (journal, reports) is made and kept in this local folder, not uploaded, and the name, chosen and
    # claimed by the driver, is not checked again.
    run_folder: str = setting("", "output", flag=False)
    save_images: str = setting("all", "output", "all, none, or N (every N-th frame)",
                               switches=(Switch("--nosave", "none", "--save-images none"),))
    save_txt: bool = setting(False, "output", "YOLO label files in labels/")
    save_conf: bool = setting(False, "output", "the score in each label line")
    save_crop: bool = setting(False, "output", "each detection's box cut out of the frame, in crops/<class>/, for "
                              "the frames whose images are saved")
    line_thickness: int = setting(0, "output", "box line width in pixels (0: scaled with the image)")
    hide_labels: bool = setting(False, "output", "boxes without class name and score")
    hide_conf: bool = setting(False, "output", "labels without the score")
    log_level: str = setting("info", "output", "debug, info, warning or error")
    progress: bool = setting(True, "output", flag=False, switches=(Switch("--no-progress", False, "no progress bar"),))
    allow_failures: bool = setting(False, "output", "exit 0, not 3, when some frames failed")
    json: bool = setting(False, "output", "print one JSON summary on stdout, logs on stderr")
    transport: str = setting("ipc", "transport", "ipc or tcp")
    tcp_host: str = setting("127.0.0.1", "transport", "tcp: the host every socket binds and connects on")
    tcp_base_port: int = setting(5550, "transport", "tcp: consecutive ports from here, one per bound socket")
    devices: tuple[str, ...] = field(default=(), compare=False)  # resolved from device; not a setting

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
        _check(self.data_path in DATA_PATHS, "data_path", f"one of {DATA_PATHS}", self.data_path)
        backends = backend_names()
        _check(self.backend in backends, "backend", f"one of {backends}", self.backend)
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
        _check(self.heartbeat_timeout_s >= 1.0, "heartbeat_timeout_s",
               ">= 1 (a process beats three times within it, at most once a second)", self.heartbeat_timeout_s)
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
                              cuda_graphs=self.cuda_graphs, pin_threads=False)  # several inference processes share the cores

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


# TOML section -> the RunConfig fields it may hold; the switches that turn a setting off.
SECTIONS: dict[str, tuple[str, ...]] = sections(RunConfig)
SWITCHES_OFF: dict[str, str] = switches_off(RunConfig)


def flag_of(field_name: str, value: Any = True) -> str:
    """The runner's flag that sets ``field_name`` to ``value``: ``--batch-size``, ``--square`` (rect off)."""
    if value is False and field_name in SWITCHES_OFF:
        return SWITCHES_OFF[field_name]
    return own_flag(field_name)


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
