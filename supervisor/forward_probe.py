"""The "--backend openvino" lever measured, not guessed (see ``analysis.bottleneck.backend_lever``).

Before a torch run on the CPU, when OpenVINO is installed and this model's conversion is already
in its disk cache, the runner times torch's forward and OpenVINO's side by side, interleaved, at
the run's first input shape, inference threads and precision: a few forwards each, one to two
seconds. The report scales inference's measured forward time by their ratio. It is measured
before the stages start, so both forwards see the same machine; the ratio, not either time, is
what the report applies to the loaded run. Nothing is converted here (tens of seconds): without
a cached conversion the probe records why, and the lever says it is unmeasured."""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import statistics
import time
from dataclasses import dataclass

from settings.config import RunConfig
from yolo.presets import MODEL_FREE

log = logging.getLogger(__name__)

WARM_FORWARDS = 2  # the first forwards of a shape set up plans and buffers: not timed
TIMED_FORWARDS = 5
PROBED_BACKEND = "openvino"


@dataclass(frozen=True)
class ForwardProbe:
    """torch's forward beside another backend's, at one input shape; or why it was not measured."""

    backend: str
    measured: bool
    why: str = ""  # why not measured
    shape: tuple[int, ...] = ()  # (batch, 3, h, w)
    threads: int = 0
    precision: str = ""
    torch_ms: float | None = None  # median of TIMED_FORWARDS
    backend_ms: float | None = None
    forwards: int = 0

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def probe_applies(cfg: RunConfig) -> bool:
    """A torch run on the CPU with a model, where OpenVINO is installed: the lever could apply."""
    on_cpu = all(d == "cpu" for d in cfg.devices or (cfg.device,))
    has_model = cfg.preset != MODEL_FREE or bool(cfg.weights)
    return (cfg.backend == "torch" and on_cpu and has_model
            and importlib.util.find_spec(PROBED_BACKEND) is not None)


def first_input_shape(cfg: RunConfig, plan) -> tuple[int, int, int, int]:
    """(batch, 3, h, w) of the run's first forwards: the first image's or video's letterbox; an
    imgsz square where the size is not known before reading (streams, synthetic scenes)."""
    from yolo.letterbox import letterbox_shape
    size = _first_frame_hw(plan)
    if size is None:
        h, w = cfg.imgsz, cfg.imgsz
    else:
        h, w = letterbox_shape(size, cfg.imgsz, rect=cfg.rect)
    return cfg.batch_size, 3, h, w


def _first_frame_hw(plan) -> tuple[int, int] | None:
    from inputs.imageio import image_size
    item = next((i for i in plan.items if i.kind in ("image", "video")), None)
    if item is None:
        return None
    if item.kind == "video":
        return (item.video.height, item.video.width) if item.video else None
    try:
        with open(item.location, "rb") as f:
            size = image_size(f.read(1 << 16))  # the header is in the first bytes
    except OSError:
        return None
    return (size[1], size[0]) if size else None


def probe_forwards(cfg: RunConfig, plan) -> ForwardProbe | None:
    """The probe for this run (see the module's docstring); None where the lever cannot apply."""
    if not probe_applies(cfg):
        return None
    from backends.openvino import OpenVinoError, cached_model_path
    try:
        cached = cached_model_path(cfg.weights or None, preset=cfg.preset, fuse=cfg.fuse)
    except OpenVinoError as exc:
        return ForwardProbe(PROBED_BACKEND, False, why=str(exc))
    if cached is None:
        return ForwardProbe(PROBED_BACKEND, False,
                            why="no converted model cached: one run with --backend openvino converts it")
    try:
        return measure_side_by_side(cfg, first_input_shape(cfg, plan))
    except (OpenVinoError, RuntimeError, ValueError) as exc:  # a failed probe must not stop the run
        log.warning("could not time OpenVINO's forward beside torch's: %s", exc)
        return ForwardProbe(PROBED_BACKEND, False, why=f"the measurement failed: {exc}")


def measure_side_by_side(cfg: RunConfig, shape: tuple[int, ...], forwards: int = TIMED_FORWARDS) -> ForwardProbe:
    """Median ms of torch's and OpenVINO's forward at ``shape`` with the run's inference threads
    and precision, alternating which goes first, so a drift of the machine hits both alike."""
    import torch

    from yolo.checkpoint import load_model
    from backends.openvino import OpenVinoModel
    from yolo.precision import choose_precision
    precision = choose_precision(torch.device("cpu"), cfg.half)
    threads = cfg.infer_threads or 1
    torch_model = load_model(cfg.weights or None, preset=cfg.preset, precision=precision, fuse=cfg.fuse,
                             inplace=cfg.inplace, channels_last=cfg.channels_last)
    other = OpenVinoModel(cfg.weights or None, preset=cfg.preset, precision=precision, threads=threads, fuse=cfg.fuse,
                          pin_threads=False)
    x = torch.rand(shape)
    saved_threads = torch.get_num_threads()
    torch.set_num_threads(threads)  # as each inference process runs it
    try:
        with torch.inference_mode():
            calls = {"torch": lambda: torch_model(x.to(torch_model.input_dtype)), PROBED_BACKEND: lambda: other(x)}
            times = _interleaved_ms(calls, WARM_FORWARDS, forwards)
    finally:
        torch.set_num_threads(saved_threads)
    probe = ForwardProbe(PROBED_BACKEND, True, shape=tuple(shape), threads=threads, precision=precision,
                         torch_ms=statistics.median(times["torch"]),
                         backend_ms=statistics.median(times[PROBED_BACKEND]), forwards=forwards)
    log.info("forward at %s, %d thread(s), %s: torch %.1f ms, OpenVINO %.1f ms (median of %d each, interleaved)",
             "x".join(map(str, shape)), threads, precision, probe.torch_ms, probe.backend_ms, forwards)
    return probe


def _interleaved_ms(calls: dict, warm: int, timed: int) -> dict[str, list[float]]:
    """Each call's wall ms over ``timed`` rounds after ``warm`` untimed ones; the order of the
    calls alternates every round."""
    names = list(calls)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(warm + timed):
        for name in names if r % 2 == 0 else names[::-1]:
            started = time.perf_counter()
            calls[name]()
            if r >= warm:
                times[name].append((time.perf_counter() - started) * 1e3)
    return times
