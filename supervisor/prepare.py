"""Everything checked and decided before any process starts, so a bad value is an error naming it
(exit 2) instead of a worker that dies after start-up: worker counts, devices, the weights file
and its class names, the frame plan, the results folder, and the size of the frame slots."""

from __future__ import annotations

import dataclasses
import errno
import logging
import math
import os
import shutil
import tempfile
import time

from analysis.machine import Machine
from backends.registry import backend_names, backend_spec, check_backend
from backends.registry import prepare_backend as prepare_backend_once
from supervisor.limits import check_descriptors, check_frame_memory
from settings.config import ConfigError, RunConfig
from supervisor.stored_runs import check_name_free, check_store, make_local_run_dir, name_taken
from inputs.object_store import is_store_url
from analysis.machine import usable_cores
from sharedmem.slots import SHM_DIR, aligned, free_bytes, ring_slot_bytes
from yolo.precision import choose_precision, has_native_bf16, read_cpu_flags
from yolo.presets import MODEL_FREE, PRESETS

LETTERBOX_CHANNELS = 3
DEFAULT_ORIGINAL_HW = (1080, 1920)  # slot size for originals when the source's largest is unknown
MAX_NAME_SUFFIX = 10000  # exp, exp2, ... exp9999, as Ultralytics' increment_path tries
# What a run writes into its folder: a run reusing a folder (--exist-ok) removes these first, so
# the old run's images, labels or crops never sit beside the new report. Anything else stays.
RUN_OUTPUT_DIRS = ("images", "videos", "labels", "crops")
RUN_OUTPUT_FILES = ("report.json", "report.md", "modules.csv", "detections.json", "predictions.json", "trace.json",
                    "run.log", "plots.png", "latency.png", "timeline.png", "modules.png", "resources.png")
MAX_SLOT_ORIGINAL_PIXELS = 3840 * 2160  # a larger original travels in its message instead
SHM_FILL = 0.8  # the rings may take this share of the free shared memory; the rest for restarts' rings

log = logging.getLogger(__name__)


def resolve(cfg: RunConfig) -> tuple[RunConfig, Machine, tuple[str, ...]]:
    """Fill the automatic counts and check devices, preset and weights; returns the resolved
    config, the machine, and the class names. torch is imported only for CUDA or weights."""
    specs = device_specs(cfg.device)
    if not specs:
        raise ConfigError(f"config device: expected cpu, cuda, cuda:N or a list, got {cfg.device!r}")
    on_cuda = any(s.startswith("cuda") for s in specs)
    _check_backend(cfg, on_cuda)
    if on_cuda:
        from yolo.devices import resolve_device
        try:
            devices = [str(resolve_device(s)) for s in specs]
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if any(not d.startswith("cuda") for d in devices):
            raise ConfigError(f"config device: expected all CPU or all CUDA devices, got {cfg.device!r}")
    elif specs != ["cpu"]:
        raise ConfigError(f"config device: expected cpu, cuda, cuda:N or a list of cuda devices, got {cfg.device!r}")
    else:
        devices = ["cpu"]
    machine = Machine(cores=usable_cores(), device_type="cuda" if on_cuda else "cpu",
                      bf16=has_native_bf16(read_cpu_flags()), gpus=len(devices) if on_cuda else 0)
    if cfg.preset not in PRESETS and cfg.preset != MODEL_FREE:
        raise ConfigError(f"config preset: expected one of {sorted(PRESETS)} or {MODEL_FREE!r}, got {cfg.preset!r}")
    try:
        choose_precision(devices[0], cfg.half)
    except ValueError as exc:
        raise ConfigError(f"config half: {exc}") from None
    data_path = _data_path(cfg, on_cuda)
    module_timing = _module_timing(cfg, on_cuda)
    names = _class_names(cfg)
    _check_classes(cfg.classes, names)
    cores = machine.cores
    workers = cfg.workers or cores
    infer = cfg.infer_workers or (len(devices) if on_cuda else cores)
    resolved = dataclasses.replace(cfg, classes=tuple(cfg.classes), workers=workers,
                                   pre_workers=cfg.pre_workers or workers, post_workers=cfg.post_workers or workers,
                                   infer_workers=infer, infer_threads=cfg.infer_threads or 1, devices=tuple(devices),
                                   data_path=data_path, module_timing=module_timing)
    check_descriptors(resolved)
    check_frame_memory(resolved, resolved.pre_workers * ring_frames(resolved))
    return resolved, machine, names


def _data_path(cfg: RunConfig, on_cuda: bool) -> str:
    """``auto`` resolved (device with CUDA, host on a CPU); what the device path cannot do refused."""
    data_path = cfg.data_path if cfg.data_path != "auto" else ("device" if on_cuda else "host")
    if data_path != "device":
        return data_path
    if cfg.decode != "full":
        raise ConfigError(f"config decode: expected 'full' with data_path device (the device decodes whole JPEGs), "
                          f"got {cfg.decode!r}")
    if _runs_a_model(cfg) and not backend_spec(cfg.backend).device_tensors:
        takers = [name for name in backend_names() if backend_spec(name).device_tensors]
        raise ConfigError(f"config data_path: device needs a backend that takes device tensors ({', '.join(takers)}), "
                          f"got backend {cfg.backend!r}: use --data-path host")
    return data_path


def _module_timing(cfg: RunConfig, on_cuda: bool) -> str:
    """--cuda-graphs needs CUDA, and turns the per-module timing off (a graph's replay runs none of
    the Python hooks that time the modules)."""
    if not cfg.cuda_graphs:
        return cfg.module_timing
    if not on_cuda:
        raise ConfigError(f"config cuda_graphs: expected a CUDA device (a CUDA graph replays GPU kernels), got device "
                          f"{cfg.device!r}")
    if cfg.module_timing != "none":
        log.info("--cuda-graphs: per-module timing is off (--module-timing %s asked for it; a graph's replay runs "
                 "no Python hooks), the forward is timed whole", cfg.module_timing)
    return "none"


def _runs_a_model(cfg: RunConfig) -> bool:
    """A model runs in this run (a model-free run has none for a backend to load)."""
    return cfg.preset != MODEL_FREE or bool(cfg.weights)


def _check_backend(cfg: RunConfig, on_cuda: bool) -> None:
    if not _runs_a_model(cfg):
        return
    try:
        check_backend(cfg.backend, "cuda" if on_cuda else "cpu")
    except ValueError as exc:
        raise ConfigError(f"config backend: {exc}") from None


def prepare_backend(cfg: RunConfig) -> None:
    """The backend's once-per-run preparation, before any inference process starts (OpenVINO
    converts the model into its disk cache here, not in every process at once)."""
    if not _runs_a_model(cfg):
        return
    try:
        done = prepare_backend_once(cfg.backend, cfg.backend_options(cfg.devices[0], "fp32", cfg.infer_threads))
    except (RuntimeError, ValueError) as exc:  # the backend's own error (OpenVinoError is a RuntimeError)
        raise ConfigError(f"config backend: {exc}") from None
    if done:
        log.info("%s", done)


def device_specs(device: str) -> list[str]:
    """The devices of a ``--device`` value; a bare index is a CUDA device, as in Ultralytics'
    ``--device 0`` or ``--device 0,1``."""
    specs = [s.strip() for s in device.split(",") if s.strip()]
    return [f"cuda:{s}" if s.isdigit() else s for s in specs]


def _check_classes(classes, names: tuple[str, ...]) -> None:
    """--classes ids the model does not have would silently keep nothing: refused."""
    unknown = [c for c in classes or () if not 0 <= c < len(names)]
    if unknown:
        raise ConfigError(f"config classes: expected class ids 0..{len(names) - 1} (the model has {len(names)} "
                          f"classes), got {', '.join(map(str, unknown))}")


def _class_names(cfg: RunConfig) -> tuple[str, ...]:
    from yolo.names import default_names
    if not cfg.weights:
        return tuple(default_names(80))
    if not os.path.isfile(cfg.weights):
        raise ConfigError(f"config weights: expected a checkpoint file, got {cfg.weights!r} (no such file)")
    from yolo.checkpoint import CheckpointError, read_checkpoint  # imports torch: only with a weights file
    try:
        return tuple(read_checkpoint(cfg.weights).names)
    except CheckpointError as exc:
        raise ConfigError(f"config weights: {exc}") from None


def check_results_dir(results: str) -> None:
    """The folder of run folders must exist (or be creatable) and be writable, checked now; a
    store's URL must take an object (supervisor/stored_runs.py)."""
    if is_store_url(results):
        return check_store(results)
    if os.path.exists(results) and not os.path.isdir(results):
        raise ConfigError(f"config results: expected a folder, got a file: {results!r}")
    try:
        os.makedirs(results, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=results, prefix=".write-check-"):
            pass
    except OSError as exc:
        reason = "read-only file system" if exc.errno == errno.EROFS else exc.strerror
        raise ConfigError(f"config results: cannot write run folders in {results!r} ({reason})") from None


def free_run_name(results: str, name: str, exist_ok: bool) -> str:
    """The run folder's name: ``name`` itself when it is free or ``exist_ok``, else the first free
    of ``name2``, ``name3``, ... (Ultralytics' ``exp`` -> ``exp2``); "" stays "" (a timestamp).
    In a store, a name is taken by a finished run (its report.json); one that a run still writes
    (its ``.running`` marker) is refused (ConfigError) unless ``exist_ok``."""
    in_store = is_store_url(results)
    taken = (lambda n: name_taken(results, n)) if in_store else (lambda n: os.path.lexists(os.path.join(results, n)))
    free = name
    if name and not exist_ok and taken(name):
        free = next((f"{name}{n}" for n in range(2, MAX_NAME_SUFFIX) if not taken(f"{name}{n}")), None)
        if free is None:
            raise ConfigError(f"config name: expected a free run folder name, got {name!r} with {name}2 ... "
                              f"{name}{MAX_NAME_SUFFIX - 1} all taken in {results!r}")
    if in_store:
        check_name_free(results, free, exist_ok)
    return free


# A --duration run over files plans this many frames per second, looping the source: a GPU
# pipeline passes 1,000 fps, and a plan that runs out ends the run before its duration.
DURATION_FPS_CEILING = 10_000


def plan_source(cfg: RunConfig, download_dir: str = ""):
    """The frame plan; with --duration over a finite source, enough looped frames to outlast it.
    A video URL whose server cannot seek is downloaded into ``download_dir`` (see inputs.downloads)."""
    from inputs.imageio import set_opencv_pixel_limit
    from inputs.kinds import source_kind
    from inputs.sources import plan_frames
    from inputs.streams import StreamOptions
    set_opencv_pixel_limit(cfg.max_pixels)  # before any stage loads OpenCV: it reads the limit at import
    frames = cfg.frames or None
    streams = StreamOptions(download_dir=download_dir)
    try:
        plan = plan_frames(cfg.source, frames, cfg.synthetic_count, vid_stride=cfg.vid_stride, streams=streams)
        if cfg.duration and not cfg.frames and not plan.open_ended:
            plan = plan_frames(cfg.source, math.ceil(cfg.duration * DURATION_FPS_CEILING), cfg.synthetic_count,
                               vid_stride=cfg.vid_stride, streams=streams)
    except ValueError as exc:
        raise ConfigError(f"config source: {exc}") from None
    kind = source_kind(plan.source)
    if kind is not None and kind.check_workers is not None:  # a feed: one reader per file
        try:
            kind.check_workers(plan, cfg.pre_workers)
        except ValueError as exc:
            raise ConfigError(f"config source: {exc}") from None
    return plan


def make_run_dir(results: str, name: str = "", exist_ok: bool = False, local: str = "", claimed: bool = False) -> str:
    """The run folder, made in one step (mkdir), so of two runs started together with the same
    name one gets it and the other a ConfigError; without a name, a fresh timestamp. For a
    store's URL, the run's own folder is made in ``local`` (a private folder), its name checked
    and claimed in the store, or used as it is when ``claimed`` (a cluster node's share of a run;
    supervisor/stored_runs.py)."""
    if is_store_url(results):
        return make_local_run_dir(results, name, exist_ok, local, RUN_OUTPUT_DIRS + RUN_OUTPUT_FILES, claimed)
    if name:
        path = os.path.join(results, name)
        os.makedirs(results, exist_ok=True)
        try:
            os.mkdir(path)  # one call: of two runs given the same --name, one gets it, the other is told
        except FileExistsError:
            if not exist_ok:
                raise ConfigError(f"--name: run folder {path!r} exists (made by another run just now); choose "
                                  "another --name or pass --exist-ok to reuse it") from None
            clear_run_outputs(path)  # images/, videos/, labels/ are made when something goes there
        return path
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_id, n = stamp, 1
    while True:
        try:
            os.makedirs(os.path.join(results, run_id))
            break
        except FileExistsError:
            n += 1
            run_id = f"{stamp}-{n}"
    return os.path.join(results, run_id)


def clear_run_outputs(run_dir: str) -> list[str]:
    """Remove what an earlier run wrote in ``run_dir`` (RUN_OUTPUT_DIRS and RUN_OUTPUT_FILES);
    returns the names removed. Other files, the user's, are left alone."""
    removed = []
    for name in RUN_OUTPUT_DIRS + RUN_OUTPUT_FILES:
        path = os.path.join(run_dir, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.remove(path)
        else:
            continue
        removed.append(name)
    if removed:
        log.info("--exist-ok: removed the earlier run's %s from %s", ", ".join(removed), run_dir)
    return removed


def point_latest(run_dir: str) -> None:
    """``results/latest`` -> this run; called only once its report exists (not for a store's)."""
    results, run_id = os.path.split(os.path.normpath(run_dir))
    latest = os.path.join(results, "latest")
    if os.path.exists(latest) and not os.path.islink(latest):
        return  # a real file or folder of the user's: leave it
    tmp = latest + ".tmp"
    if os.path.lexists(tmp):
        os.remove(tmp)
    os.symlink(run_id, tmp)
    os.replace(tmp, latest)


def slot_plan(cfg: RunConfig, plan) -> tuple[int, int]:
    """(bytes per slot, slots per preprocess worker); (0, 0) on tcp, where pixels travel in the
    message. A slot holds the letterboxed frame and, when images are saved, the original."""
    if cfg.transport != "ipc":
        return 0, 0
    lb_bytes = LETTERBOX_CHANNELS * cfg.imgsz * cfg.imgsz
    original = _largest_frame_hw(plan) if cfg.save_every else (0, 0)
    original_pixels = min(original[0] * original[1], MAX_SLOT_ORIGINAL_PIXELS)
    slot_bytes = aligned(lb_bytes) + aligned(original_pixels * 3)
    slot_count = ring_frames(cfg)
    needed, free = ring_slot_bytes(slot_bytes) * slot_count * cfg.pre_workers, free_bytes()
    if needed > SHM_FILL * free:
        log.warning("shared memory: the frame slots need %.0f MB and %s has %.0f MB free: frames travel in the "
                    "messages instead (slower; give the container a larger /dev/shm, e.g. docker --shm-size=1g)",
                    needed / 1e6, SHM_DIR, free / 1e6)
        return 0, 0
    return slot_bytes, slot_count


def ring_frames(cfg: RunConfig) -> int:
    """Frames one preprocess worker can have in flight (its ring of slots): credit at inference
    plus a batch being formed, frames at postprocess, and two being made."""
    at_inference = cfg.infer_workers * cfg.credit_per_producer() + cfg.batch_size
    at_postprocess = math.ceil(cfg.post_workers * cfg.prefetch * cfg.infer_workers / cfg.pre_workers)
    return at_inference + at_postprocess + 2


def _largest_frame_hw(plan) -> tuple[int, int]:
    """The largest frame the plan's items hold, as each input kind tells the sizes of its items
    (videos: what planning probed; images: the headers of the first few; synthetic scenes)."""
    from inputs.kinds import planned_frame_sizes
    sizes = [DEFAULT_ORIGINAL_HW, *planned_frame_sizes(plan.items)]
    return max(sizes, key=lambda hw: hw[0] * hw[1])
