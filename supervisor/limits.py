"""The machine's limits, checked before any process starts: a plan that cannot fit is exit 2 with
the figure it needs, never an OOM kill, a libzmq abort on "Too many open files", or a torch import
that fails in the fork server.

Where a soft limit (``ulimit -S``) is lower than the plan needs and the hard one allows more, the
soft one is raised for this run (children inherit it): that is what the hard limit is for.
"""

from __future__ import annotations

import logging
import math
import resource

import psutil

from topology.stages import stage_counts
from settings.config import ConfigError, RunConfig
from yolo.presets import MODEL_FREE

log = logging.getLogger(__name__)

# Open files: a process holds about this many for Python, its libraries, log files and ZeroMQ's
# own; then a few per peer (a connection, its socket's signalling pipes). Measured with
# --workers 12 (27 processes): the runner held 104, an inference worker 64; this formula says 140.
BASE_DESCRIPTORS = 32
DESCRIPTORS_PER_PROCESS = 4

# Address space (ulimit -v) of a process that imports torch, torchvision and OpenCV and runs a
# forward: VmPeak 3.8 GB after the imports and 3.95 GB after a yolov5n forward at 640 (torch 2.x,
# CPU). A fork-server child shares those mappings, and needs them all.
TORCH_ADDRESS_SPACE_BYTES = 4_200_000_000

# Memory of a frame in flight: the letterboxed uint8 (3 bytes a pixel) in its slot or message, and
# a copy while it is made; a forward's activations at least 64 bytes per input pixel (measured
# 70-104 for yolov5n and yolov5x at 320 and 640; this is the low end, to refuse only plans that
# cannot fit); with no model, the uint8 batch alone.
LETTERBOX_BYTES_PER_PIXEL = 3 * 2
FORWARD_BYTES_PER_PIXEL = 64
MEMORY_FILL = 0.9  # of the memory available: the rest for the processes' own code and the OS
IMGSZ_STEP = 32


def descriptors_needed(processes: int) -> int:
    """Open files the busiest process of a run of ``processes`` needs (the runner: every process
    connects to its control, health and progress sockets)."""
    return BASE_DESCRIPTORS + DESCRIPTORS_PER_PROCESS * processes


def check_descriptors(cfg: RunConfig) -> None:
    """Raise the soft open-file limit to what the plan needs if the hard one allows, else refuse."""
    processes = sum(stage_counts(cfg).values()) + 1  # + the runner
    needed = descriptors_needed(processes)
    if not _raise_soft_limit(resource.RLIMIT_NOFILE, needed):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        raise ConfigError(f"config workers: {processes} processes need about {needed} open files each, and this "
                          f"shell allows {soft} (ulimit -n; hard limit {hard}): raise it (ulimit -n {needed}) "
                          "or use fewer --workers")


def check_address_space(needed: int = TORCH_ADDRESS_SPACE_BYTES) -> None:
    """Before the fork server imports torch: a ``ulimit -v`` too small for it is refused here,
    naming memory, instead of an ImportError or abort in the fork server."""
    if not _raise_soft_limit(resource.RLIMIT_AS, needed):
        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        raise ConfigError(f"memory: the address space is limited to {soft / 1e6:.0f} MB (ulimit -v {soft // 1024}), "
                          f"and a process with torch needs about {needed / 1e6:.0f} MB of it: raise it "
                          f"(ulimit -v {math.ceil(needed / 1024)}, or unlimited)")


def frame_memory_bytes(cfg: RunConfig, imgsz: int, frames_in_flight: int) -> int:
    """The least memory the run's frames take at ``imgsz``: each frame in flight letterboxed, and
    one batch per inference worker through the model."""
    pixels = imgsz * imgsz
    model_free = cfg.preset == MODEL_FREE and not cfg.weights
    forward = LETTERBOX_BYTES_PER_PIXEL if model_free else FORWARD_BYTES_PER_PIXEL
    return frames_in_flight * LETTERBOX_BYTES_PER_PIXEL * pixels + cfg.infer_workers * cfg.batch_size * forward * pixels


def check_frame_memory(cfg: RunConfig, frames_in_flight: int, available: int | None = None) -> None:
    """Refuse an --imgsz whose frames cannot fit in the memory available, giving the largest that can."""
    available = psutil.virtual_memory().available if available is None else available
    budget = MEMORY_FILL * available
    if frame_memory_bytes(cfg, cfg.imgsz, frames_in_flight) <= budget:
        return
    fits = _largest_imgsz(lambda size: frame_memory_bytes(cfg, size, frames_in_flight) <= budget, cfg.imgsz)
    advice = f"--imgsz {fits} is the largest that fits" if fits else "no --imgsz fits: free some memory"
    raise ConfigError(f"config imgsz: frames of {cfg.imgsz}x{cfg.imgsz} need at least "
                      f"{frame_memory_bytes(cfg, cfg.imgsz, frames_in_flight) / 1e6:.0f} MB ({frames_in_flight} in "
                      f"flight, {cfg.infer_workers} forwards of batch {cfg.batch_size}) and {available / 1e6:.0f} MB "
                      f"is available; {advice}")


def _largest_imgsz(fits, above: int) -> int:
    """The largest multiple of IMGSZ_STEP under ``above`` for which ``fits(imgsz)``; 0 if none."""
    low, high = 0, max(0, (above - 1) // IMGSZ_STEP)  # in steps; fits(low) is taken as true
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle * IMGSZ_STEP):
            low = middle
        else:
            high = middle - 1
    return low * IMGSZ_STEP


def _raise_soft_limit(which: int, needed: int) -> bool:
    """True when the soft limit is (now) at least ``needed``; raises it up to the hard limit."""
    soft, hard = resource.getrlimit(which)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return True
    if hard != resource.RLIM_INFINITY and hard < needed:
        return False
    resource.setrlimit(which, (needed, hard))
    log.info("raised the soft limit %s from %d to %d (the plan needs it; the hard limit allows it)",
             _LIMIT_NAMES.get(which, which), soft, needed)
    return True


_LIMIT_NAMES = {resource.RLIMIT_NOFILE: "ulimit -n", resource.RLIMIT_AS: "ulimit -v (bytes)"}
