"""Hand-made ``RunData`` for the analysis tests: a steady pipeline whose figures are known by
construction. Frame i is read at STARTED_S + i * period_s and goes through pre, a 1 ms queue,
infer, a 1 ms queue and post, so one frame completes every period_s; each stage takes its wall
ms and CPU ms per frame; each process's cumulative CPU in the resource samples grows at the rate
its share of the frames and its CPU per frame give."""

from __future__ import annotations

from analysis.run_data import RunData
from analysis.samples import Samples

STARTED_S = 100.0
ROLES = ("pre", "infer", "post")
RESOURCE_PERIOD_S = 0.5
MIB = 1 << 20
RSS_MIB = {"pre": 150, "infer": 400, "post": 160, "collector": 120, "runner": 100}


def steady_run(frames: int = 120, period_s: float = 0.05, warmup: int = 0, cores: int = 2,
               workers: dict | None = None, wall_ms: dict | None = None, cpu_ms: dict | None = None,
               busy: dict | None = None, blocked: dict | None = None, draw_save_ms: tuple = (2.0, 3.0),
               other_cpu_ms: float = 2.0, cold_first: bool = True, config: dict | None = None,
               machine: dict | None = None, resources: bool = True, forward_ms: float | None = None,
               **changes) -> RunData:
    """``other_cpu_ms``: the runner's and collector's CPU per frame together (half each);
    ``forward_ms``: inference's forward sub-stage per frame (none recorded when None)."""
    workers = {"pre": 2, "infer": 2, "post": 2, **(workers or {})}
    wall_ms = {"pre": 10.0, "infer": 30.0, "post": 10.0, **(wall_ms or {})}
    cpu_ms = {**wall_ms, **(cpu_ms or {})}
    busy = {"pre": 0.2, "infer": 0.6, "post": 0.2, **(busy or {})}
    blocked = {"pre": 0.0, "infer": 0.0, "post": 0.0, **(blocked or {})}
    frame_list = [_frame(i, period_s, wall_ms, workers, cold=cold_first and i < workers["infer"])
                  for i in range(frames)]
    end_s = frame_list[-1]["t"]["post_end"] if frame_list else STARTED_S
    wall_s = end_s - STARTED_S + 1.0
    stats = []
    for role in ROLES:
        for k in range(workers[role]):
            mine = [f for f in frame_list if f["workers"][role] == f"{role}-{k}"]
            stats.append(_worker(role, k, len(mine), wall_s, wall_ms[role], cpu_ms[role], busy[role], blocked[role],
                                 draw_save_ms if role == "post" else None, forward_ms if role == "infer" else None))
    stats.append({**_worker("collector", 0, 0, wall_s, 0.0, 0.0, 0.01, 0.0, None), "name": "collector"})
    cfg = {"device": "cpu", "batch_size": 1, "imgsz": 640, "rect": True, "weights": "", "preset": "yolov5n",
           "save_images": "all", "half": False, "prefetch": 2, **(config or {})}
    run = dict(run_id="steady", config=cfg, environment={"cpu_cores": cores}, frames_in=frames, warmup=warmup,
               started_s=STARTED_S, finished_s=end_s + 0.1, frames=frame_list, failed=[], detections=[],
               workers=stats, links={"pre->infer": {"frames": frames, "bytes": frames * 1000}},
               module_rows=[], forward={}, module_spans=[],
               resources=_resources(workers, cpu_ms, other_cpu_ms, period_s, end_s) if resources else {},
               machine={"cores": cores, "device_type": "cpu", "bf16": False, **(machine or {})})
    run.update(changes)
    return RunData(**run)


def _frame(i: int, period_s: float, wall_ms: dict, workers: dict, cold: bool) -> dict:
    t = STARTED_S + i * period_s
    stamps = {"read_start": t, "read_end": t + 0.3 * wall_ms["pre"] / 1e3}
    t += wall_ms["pre"] / 1e3
    stamps["pre_end"] = t
    stamps["infer_recv"] = stamps["infer_start"] = t = t + 0.001
    stamps["infer_end"] = t = t + wall_ms["infer"] / 1e3
    stamps["post_start"] = t = t + 0.001
    stamps["post_end"] = t + wall_ms["post"] / 1e3
    return {"id": i, "name": f"img{i}.jpg", "batch": 1, "detections": 1, "image_saved": True, "cold": cold,
            "workers": {role: f"{role}-{i % workers[role]}" for role in ROLES}, "t": stamps}


def _worker(role: str, k: int, frames: int, wall_s: float, wall_ms: float, cpu_ms: float, busy: float,
            blocked: float, draw_save_ms: tuple | None, forward_ms: float | None = None) -> dict:
    substages = {} if forward_ms is None else {"forward": Samples([forward_ms] * frames).to_dict()}
    if draw_save_ms is not None:
        substages = {"nms": Samples([1.0] * frames).to_dict(), "draw": Samples([draw_save_ms[0]] * frames).to_dict(),
                     "save": Samples([draw_save_ms[1]] * frames).to_dict()}
    busy_s = busy * wall_s
    busy_cpu_s = busy_s * (cpu_ms / wall_ms) if wall_ms else 0.0
    return {"name": f"{role}-{k}", "role": role, "incarnation": 0, "pid": 1000 + 10 * ROLES.index(role) + k
            if role in ROLES else 1100, "device": "cpu", "threads": {"torch": 1, "interop": 1, "opencv": 1},
            "precision": "fp32" if role == "infer" else None, "frames": frames, "batches": frames if role == "infer"
            else 0, "wall_s": wall_s, "busy_s": busy_s, "busy_cpu_s": busy_cpu_s, "cpu_s": busy_cpu_s * 1.05,
            "wait_in_s": (1 - busy - blocked) * wall_s, "blocked_out_s": blocked * wall_s,
            "frame_ms": Samples([wall_ms] * frames).to_dict(), "frame_cpu_ms": Samples([cpu_ms] * frames).to_dict(),
            "substages_ms": substages, "bytes_in": 0, "bytes_out": 0, "messages_in": frames, "messages_out": frames,
            "link": None, "dropped_messages": {}}


def _resources(workers: dict, cpu_ms: dict, other_cpu_ms: float, period_s: float, end_s: float) -> dict:
    """Samples from 1 s before the first read to 0.5 s after the last completion; CPU grows
    linearly at (frames per second handled) x (CPU ms per frame) per process."""
    first = STARTED_S - 1.0
    times = [first + RESOURCE_PERIOD_S * n for n in range(int((end_s + 0.5 - first) / RESOURCE_PERIOD_S) + 1)]
    rates = {f"{role}-{k}": (role, cpu_ms[role] / 1e3 / period_s / workers[role])
             for role in ROLES for k in range(workers[role])}
    rates["collector"] = ("collector", other_cpu_ms / 2 / 1e3 / period_s)
    rates["runner"] = ("runner", other_cpu_ms / 2 / 1e3 / period_s)
    resources = {}
    for i, (name, (role, rate)) in enumerate(rates.items()):
        rss = RSS_MIB[role] * MIB
        resources[name] = {"pid": 2000 + i, "role": role,
                           "samples": [[t, 1.0 + rate * (t - first), rss + (MIB if n % 2 else 0), int(rss * 0.6)]
                                       for n, t in enumerate(times)]}
    return resources
