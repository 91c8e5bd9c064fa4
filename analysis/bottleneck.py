"""The pipeline's bound on this machine, which stage limits it, and what to change.

The bound is the smallest of: each stage's capacity (its workers x 1000 / its ms per frame, see
``analysis.stages.stage_capacity``) and, since the stages share the CPU cores, cores x 1000 /
the CPU ms the whole pipeline spends per frame. All of these are measured under the run's own
load (shared hyperthreads, caches, memory bandwidth), not in a process alone, which would give
a bound no loaded pipeline reaches.

The limiting stage is the busiest by wall time (a limiting stage never waits; the stage before
it is held back on output, the one after it starved for input). The levers depend on the
limit: with the cores saturated only less work per frame helps (more processes only time-slice
the same cores); with cores to spare, more workers for the limiting stage do."""

from __future__ import annotations

from settings.config import flag_of
from topology.stages import frame_roles, kind_of, title
from analysis.stages import device_usage
from analysis.stats import ratio
from analysis.windows import STABLE_WINDOWS, THROUGHPUT_WINDOW_S

CORES_SATURATED = 0.90  # CPU used / (cores x window) from which the cores are the limit
STAGE_BUSY = 0.75  # below this, no stage limits: too few frames in flight, or the source
LEVER_MIN_SHARE = 0.05  # a part of the work worth naming takes at least this share of a frame's CPU
SOURCE_WAIT_CPU_SHARE = 0.3  # preprocess CPU below this share of its busy time: it waits on a live stream
QUEUE_NOTE = 0.10  # mention a neighbour's wait or block from this share of its time
COLD_NOTE = 0.10  # mention inference's first forwards of new shapes from this share of its busy time
MIN_IMGSZ = 320
IMGSZ_STEP = 32
SMALLER_IMGSZ = 0.75  # the --imgsz proposed: this fraction of today's, to a multiple of 32
SAVE_EVERY = 10  # the every-N-th alternative proposed to --save-images none
MIN_JUDGED_FRAMES = 10  # fewer measured frames than this give no lever: their busy times are noise
MIN_JUDGED_S = THROUGHPUT_WINDOW_S  # nor does a measured window shorter than one throughput window
ADVISED_RUN_S = (STABLE_WINDOWS + 1) * THROUGHPUT_WINDOW_S  # long enough to judge stability as well


def pipeline_bound(capacities: dict[str, float | None], cores: int | None,
                   cpu_ms_per_frame: float | None) -> dict:
    """{"bound_fps", "bound_kind", "cores_bound_fps", "stage_capacity_fps"}: the smallest of the
    stage capacities and the cores' bound; ``bound_kind`` names it ("cores" or a role)."""
    cores_bound = ratio(1e3 * cores, cpu_ms_per_frame) if cores else None
    candidates = {role: fps for role, fps in capacities.items() if fps}
    if cores_bound:
        candidates["cores"] = cores_bound
    kind = min(candidates, key=candidates.get) if candidates else None
    return {"bound_fps": candidates.get(kind), "bound_kind": kind, "cores_bound_fps": cores_bound,
            "stage_capacity_fps": dict(capacities)}


def cpu_shares(cpu_by_role: dict[str, float], cpu_ms_per_frame: float | None) -> dict[str, float]:
    """Each role's share of the CPU per frame (the rest is the runner, the collector, idle polling)."""
    total = cpu_ms_per_frame or sum(cpu_by_role.values())
    return {role: ms / total for role, ms in cpu_by_role.items()} if total else {}


def busiest(stages: dict) -> str | None:
    """The role whose workers were busiest by wall time; the busier by CPU time on a tie."""
    present = [r for r in frame_roles() if stages[r]["workers"]]
    return max(present, key=lambda r: (stages[r]["utilisation"], stages[r]["cpu_utilisation"] or 0.0), default=None)


def queue_evidence(stages: dict, role: str) -> str:
    """Who waits on whom around ``role``: the stage before held back, the one after starved."""
    parts = [f"{title(role)} busy {100 * stages[role]['utilisation']:.0f} % of its time"]
    i = frame_roles().index(role)
    if i > 0 and stages[frame_roles()[i - 1]]["blocked_fraction"] >= QUEUE_NOTE:
        parts.append(f"{title(frame_roles()[i - 1])} held back by it {100 * stages[frame_roles()[i - 1]]['blocked_fraction']:.0f} %"
                     " (blocked on output)")
    if i + 1 < len(frame_roles()) and stages[frame_roles()[i + 1]]["wait_fraction"] >= QUEUE_NOTE:
        parts.append(f"{title(frame_roles()[i + 1])} starved {100 * stages[frame_roles()[i + 1]]['wait_fraction']:.0f} %"
                     " (waiting for input)")
    return ", ".join(parts)


def cold_forward_note(stages: dict) -> str:
    """Words for inference's first forwards of new input shapes when they took a large share of
    its busy time: one-off set-up (oneDNN or cuDNN plans, buffers) that its ms per frame leaves
    out, so its capacity reads higher than what it delivered."""
    infer = stages.get("infer", {})
    cold_s, busy_s = infer.get("cold_forward_s") or 0.0, infer.get("busy_s") or 0.0
    if not busy_s or cold_s < COLD_NOTE * busy_s:
        return ""
    return (f"inference spent {100 * cold_s / busy_s:.0f} % of its busy time ({cold_s:.1f} s) in "
            f"{infer['cold_forwards']} first forwards of new input shapes, left out of its ms per frame: "
            "a longer run, or fewer frame shapes (--square), spreads or removes that set-up")


def substage_cost_ms(stage: dict, names: tuple[str, ...]) -> tuple[float, float]:
    """(wall ms, CPU ms) per frame of ``stage`` spent in its sub-stages ``names``: their totals
    over every measured frame, in CPU ms by the stage's CPU / wall ratio."""
    totals = stage.get("substages_total_ms", {})
    frames = stage["ms_per_frame"]["count"] or stage["frames"]
    if not frames:
        return 0.0, 0.0
    wall = sum(totals.get(name, 0.0) for name in names) / frames
    cpu_per_wall = ratio(stage["cpu_ms_per_frame"]["mean"], stage["ms_per_frame"]["mean"]) or 1.0
    return wall, wall * min(cpu_per_wall, 1.0)


def save_cost_ms(stages: dict) -> tuple[float, float]:
    """(wall ms, CPU ms) per postprocessed frame spent drawing and saving images."""
    return substage_cost_ms(stages["post"], ("draw", "save"))


class Levers:
    """What-if estimates: the bound again with one stage's ms per frame and the CPU per frame changed."""

    def __init__(self, stages: dict, cores: int | None, cpu_ms_per_frame: float | None):
        self.stages = stages
        self.cores = cores
        self.cpu_ms = cpu_ms_per_frame
        self.capacities = {r: stages[r]["capacity"]["fps"] for r in frame_roles()}
        self.now = pipeline_bound(self.capacities, cores, cpu_ms_per_frame)

    def bound_after(self, role: str | None = None, stage_ms_saved: float = 0.0, cpu_ms_saved: float = 0.0,
                    workers: int | None = None) -> dict:
        capacities = dict(self.capacities)
        if role is not None:
            cap = self.stages[role]["capacity"]
            count = workers or self.stages[role]["workers"]
            ms = (cap["ms_per_frame"] or 0.0) - stage_ms_saved
            capacities[role] = ratio(1e3 * count, ms) if cap["fps"] else None
        cpu_ms = self.cpu_ms - cpu_ms_saved if self.cpu_ms else None
        return pipeline_bound(capacities, self.cores, cpu_ms)

    def save_images(self, save_setting) -> dict | None:
        if str(save_setting) == "none":
            return None
        wall_ms, cpu_ms = save_cost_ms(self.stages)
        if not self.cpu_ms or cpu_ms < LEVER_MIN_SHARE * self.cpu_ms:
            return None
        basis = self.stages["post"]["capacity"]["basis"]
        after = self.bound_after("post", cpu_ms if basis == "cpu" else wall_ms, cpu_ms)
        return {"flag": "--save-images none",
                "text": (f"saving images costs {cpu_ms:.0f} CPU-ms of {self.cpu_ms:.0f} per frame: --save-images none "
                         f"{_gain(self.now, after)} (--save-images {SAVE_EVERY} keeps every {SAVE_EVERY}th)"),
                "bound_fps_after": after["bound_fps"]}

    def smaller_imgsz(self, imgsz) -> dict | None:
        infer = self.stages["infer"]
        if not isinstance(imgsz, int) or imgsz <= MIN_IMGSZ or not infer["frames"]:
            return None
        smaller = max(MIN_IMGSZ, int(imgsz * SMALLER_IMGSZ) // IMGSZ_STEP * IMGSZ_STEP)
        kept = (smaller / imgsz) ** 2
        infer_cpu = infer["cpu_ms_mean"] or 0.0
        if not self.cpu_ms or infer_cpu < LEVER_MIN_SHARE * self.cpu_ms:
            return None
        after = self.bound_after("infer", (infer["capacity"]["ms_per_frame"] or 0.0) * (1 - kept),
                                 infer_cpu * (1 - kept))
        return {"flag": f"--imgsz {smaller}", "changes_results": True,
                "text": (f"--imgsz {smaller} (now {imgsz}) {_gain(self.now, after)} if inference's cost scales with "
                         "pixels (small objects are found less well)"),
                "bound_fps_after": after["bound_fps"]}

    def other_backend(self, probe: dict | None) -> dict | None:
        """--backend openvino on a torch CPU run, estimated from the forwards timed side by side
        before the run (``supervisor.forward_probe``): inference's forward time scaled by their
        ratio, the rest of its work as measured. Not offered without a probe; unmeasured (no
        estimate) when the probe says why it could not time them."""
        if not probe:
            return None
        flag = f"--backend {probe['backend']}"
        if not probe["measured"]:
            return {"flag": flag, "text": f"{flag} (its gain is unmeasured: {probe['why']})", "bound_fps_after": None}
        faster = ratio(probe["backend_ms"], probe["torch_ms"])
        forward_wall, forward_cpu = substage_cost_ms(self.stages["infer"], ("forward",))
        if not faster or faster >= 1.0 or not forward_wall or not self.now["bound_fps"]:
            return None  # no faster, or no forward measured in this run to scale
        basis = self.stages["infer"]["capacity"]["basis"]
        saved = 1.0 - faster
        after = self.bound_after("infer", (forward_cpu if basis == "cpu" else forward_wall) * saved,
                                 forward_cpu * saved)
        return {"flag": flag, "bound_fps_after": after["bound_fps"],
                "text": (f"{flag}: estimated {after['bound_fps']:.1f} fps (bound now {self.now['bound_fps']:.1f}): "
                         f"its forward took {probe['backend_ms']:.1f} ms against torch's {probe['torch_ms']:.1f} ms "
                         f"({faster:.2f}x), timed side by side before the run at "
                         f"{'x'.join(map(str, probe['shape']))}, {probe['threads']} thread(s), {probe['precision']}; "
                         f"inference's forward here takes {forward_cpu:.0f} of {self.cpu_ms:.0f} CPU-ms per frame")}

    def more_workers(self, role: str) -> dict | None:
        """One more worker for ``role``; None when the bound would not move (another limit is lower),
        or when no setting says how many (a stage a plugin added with a fixed count)."""
        count_field = kind_of(role).count if role in frame_roles() else None
        if not isinstance(count_field, str):
            return None
        flag, count = flag_of(count_field), self.stages[role]["workers"]
        after = self.bound_after(role, workers=count + 1)
        cap, new_cap = self.capacities[role], after["stage_capacity_fps"][role]
        if not cap or not new_cap:
            return {"flag": f"{flag} {count + 1}", "text": f"add {flag} (now {count})", "bound_fps_after": None}
        if self.now["bound_fps"] and after["bound_fps"] <= self.now["bound_fps"] * 1.01:
            return None
        return {"flag": f"{flag} {count + 1}",
                "text": (f"add {flag} (now {count}): {title(role)}'s capacity would rise from "
                         f"{cap:.1f} to {new_cap:.1f} fps and the bound to {after['bound_fps']:.1f} fps "
                         f"({_kind_name(after['bound_kind'])})"),
                "bound_fps_after": after["bound_fps"]}


def _gain(now: dict, after: dict) -> str:
    """How the bound moves: "would raise the CPU bound from 26.0 to 31.0 fps", or why not."""
    name = "CPU bound" if now["bound_kind"] == "cores" else "bound"
    if not now["bound_fps"] or not after["bound_fps"]:
        return "would lower the work per frame"
    if after["bound_fps"] <= now["bound_fps"] * 1.01:
        return (f"would not raise the bound ({now['bound_fps']:.1f} fps, set by {_kind_name(after['bound_kind'])}) "
                "until that limit moves")
    return f"would raise the {name} from {now['bound_fps']:.1f} to {after['bound_fps']:.1f} fps"


def _kind_name(kind: str | None) -> str:
    return "the CPU cores" if kind == "cores" else f"{title(kind)}'s capacity"


def precision_lever(device_type: str, machine: dict, stages: dict, config: dict) -> dict | None:
    """--half where it is real: fp16 on CUDA, bf16 on a CPU with native bf16 (emulated bf16 is slower)."""
    precisions = {w.get("precision") for w in stages["infer"]["per_worker"]} - {None}
    if config.get("half") or precisions - {"fp32"}:
        return None
    if device_type == "cuda":
        return {"flag": "--half", "text": "--half (fp16 inference on the GPU)", "bound_fps_after": None}
    if machine.get("bf16"):
        return {"flag": "--half", "text": "--half (bf16: this CPU computes bf16 natively; gain not estimated)",
                "bound_fps_after": None}
    return None


def backend_probe(device_type: str, machine: dict, config: dict) -> dict | None:
    """The forward probe recorded for this run where the backend lever fits: torch on the CPU."""
    if device_type != "cpu" or (config.get("backend") or "torch") != "torch":
        return None
    return machine.get("forward_probe")


def batch_lever(device_type: str, config: dict) -> dict | None:
    if (config.get("batch_size") or 1) > 1:
        return None
    if device_type == "cuda":
        return {"flag": "--batch-size 8", "text": "--batch-size 8 (fuller GPU forwards)", "bound_fps_after": None}
    return {"flag": "--batch-size 4",
            "text": "--batch-size 4 (fewer forwards and messages per frame; on CPU the gain is small: measure it)",
            "bound_fps_after": None}


def waits_on_a_live_source(stages: dict) -> bool:
    """Preprocess busy by the wall clock but mostly idle on its CPU: it spends its time waiting
    for the next frame of a live stream, which counts as busy time but uses no core."""
    pre = stages["pre"]
    return (bool(pre["workers"]) and pre["cpu_utilisation"] is not None
            and pre["cpu_utilisation"] < SOURCE_WAIT_CPU_SHARE * pre["utilisation"])


GPU_BUSY = 0.90  # a GPU busy this share of the run (at most) is the limit itself


def gpu_note(gpus: list[dict]) -> str:
    """What the inference workers' GPU figures say of an inference limit: the device busy, or
    inference's host side (launches, copies, the device data path's steps) keeping it idle."""
    known = [g for g in gpus if g.get("busy") is not None]
    if not known:
        return ""
    gpu = max(known, key=lambda g: g["busy"])
    if gpu["busy"] >= GPU_BUSY:
        return f"{gpu['device']} is busy {100 * gpu['busy']:.0f} % of the run at most: the GPU itself limits"
    return (f"{gpu['device']} is busy at most {100 * gpu['busy']:.0f} % of the run: inference's host side "
            "(kernel launches, copies, the frame steps it runs) limits, not the GPU")


def gpu_levers(role: str, limit: str, gpus: list[dict], config: dict) -> list[dict]:
    """On a GPU: the device data path where the host's frame work limits (cores saturated, or
    preprocess or postprocess busy), CUDA graphs where batch-1 inference keeps the GPU idle."""
    levers = []
    if config.get("data_path") == "host" and (limit == "cores" or role in ("pre", "post")):
        levers.append({"flag": "--data-path device", "bound_fps_after": None,
                       "text": "--data-path device (decode, letterbox, draw and encode on the GPU: the host's "
                               "cores keep only reading and writing files)"})
    idle_gpu = any(g.get("busy") is not None and g["busy"] < GPU_BUSY for g in gpus)
    if role == "infer" and idle_gpu and config.get("batch_size", 1) == 1 and not config.get("cuda_graphs"):
        levers.append({"flag": "--cuda-graphs", "bound_fps_after": None,
                       "text": "--cuda-graphs (batch 1 is bound by kernel launches: one graph launch a forward)"})
    return levers


def too_little_to_judge(measured_frames: int, window_s: float | None, fps: float | None) -> str | None:
    """Why a measured window is too small to name levers from, with how long to run instead;
    None when it is enough."""
    if measured_frames >= MIN_JUDGED_FRAMES and (window_s or 0.0) >= MIN_JUDGED_S:
        return None
    frames = f"--frames {max(MIN_JUDGED_FRAMES, round(fps * ADVISED_RUN_S))} or " if fps else ""
    return (f"{measured_frames} measured frames over {window_s or 0.0:.1f} s are too few to tell what limits the "
            f"run; run longer ({frames}--duration {ADVISED_RUN_S:g}) before changing settings")


def diagnose(stages: dict, cpu: dict, config: dict, machine: dict, measured: bool = True,
             live_source: bool = False, too_little: str | None = None) -> dict:
    """{"stage", "limit", "evidence", "hint", "levers", "cpu_shares", **pipeline_bound}: which
    stage limits and what limits the pipeline ("cores", "stage" or "flow": no stage busy;
    "source": a live stream delivers frames no faster; "unmeasured" when no frame was measured),
    the queue states that show it, and the levers that fit, ranked by ``_ranked``; ``hint`` is
    the first lever, or what sets the bound when no lever fits. With ``too_little`` (see
    :func:`too_little_to_judge`) the limit is still named, but no lever: the hint says how long
    to run instead."""
    device_type = machine.get("device_type", "cpu")
    levers = Levers(stages, cpu.get("cores"), cpu.get("cpu_ms_per_frame"))
    shares = cpu_shares(cpu.get("by_role", {}), cpu.get("cpu_ms_per_frame"))
    role = busiest(stages)
    saturation = cpu.get("saturation")
    result = {**levers.now, "stage": role, "cpu_shares": shares, "saturation": saturation}
    if role is None:
        return {**result, "limit": None, "evidence": "no stage processed a frame", "hint": "", "levers": []}
    if not measured:  # busy times then are start-up's and warm-up's: no lever can be read from them
        return {**result, "limit": "unmeasured", "levers": [],
                "evidence": "no frame was measured (warm-up and cold forwards took them all), so the busy times "
                            "are those of start-up",
                "hint": "run longer (--frames or --duration) to find what limits it"}
    gpus = device_usage(stages["infer"]["per_worker"]) if device_type == "cuda" else []
    evidence = "; ".join(part for part in (queue_evidence(stages, role), cold_forward_note(stages),
                                           gpu_note(gpus) if role == "infer" else "") if part)
    if live_source and role == "pre" and waits_on_a_live_source(stages):
        pre = stages["pre"]
        return {**result, "limit": "source", "levers": [],
                "evidence": (f"preprocess is busy {100 * pre['utilisation']:.0f} % of its time but uses "
                             f"{100 * pre['cpu_utilisation']:.0f} % of a core: it waits for the live stream's "
                             "next frame"),
                "hint": "the live source sets the rate: the pipeline keeps up with it, no setting here raises it"}
    if saturation is not None and saturation >= CORES_SATURATED:
        limit = "cores"
        evidence = (f"{100 * saturation:.0f} % busy ({saturation * cpu['cores']:.2f} of the {cpu['cores']:.2f} cores left to it), "
                    f"so more processes would only time-slice them; {evidence}; CPU per frame: "
                    + ", ".join(f"{title(r)} {100 * s:.0f} %" for r, s in
                                sorted(shares.items(), key=lambda item: -item[1])))
        candidates = [levers.save_images(config.get("save_images", "all")), levers.smaller_imgsz(config.get("imgsz")),
                      levers.other_backend(backend_probe(device_type, machine, config)),
                      precision_lever(device_type, machine, stages, config), batch_lever(device_type, config),
                      *(gpu_levers(role, "cores", gpus, config) if device_type == "cuda" else [])]
    elif stages[role]["utilisation"] >= STAGE_BUSY:
        limit = "stage"
        candidates = []
        if role == "infer":
            candidates += [levers.other_backend(backend_probe(device_type, machine, config)),
                           precision_lever(device_type, machine, stages, config),
                           batch_lever(device_type, config) if device_type == "cuda" else None]
        if role == "post":
            candidates.append(levers.save_images(config.get("save_images", "all")))
        candidates += gpu_levers(role, "stage", gpus, config) if device_type == "cuda" else []
        candidates.append(levers.more_workers(role))
    else:
        limit = "flow"
        evidence = (f"no stage is busy {100 * STAGE_BUSY:.0f} % of its time ({evidence}): too few frames are in "
                    "flight, or the source is slow")
        candidates = [{"flag": "--prefetch", "text": f"raise --prefetch (now {config.get('prefetch', '?')}) "
                                                     "to keep more frames in flight", "bound_fps_after": None}]
    chosen = _ranked([c for c in candidates if c is not None])
    if too_little:
        return {**result, "limit": limit, "evidence": evidence, "levers": [], "hint": too_little}
    hint = chosen[0]["text"] if chosen else ""
    if not chosen and levers.now["bound_fps"]:
        hint = (f"no change to {title(role)} alone would raise the bound ({levers.now['bound_fps']:.1f} fps, "
                f"set by {_kind_name(levers.now['bound_kind'])})")
    return {**result, "limit": limit, "evidence": evidence, "levers": chosen, "hint": hint}


def _ranked(levers: list[dict]) -> list[dict]:
    """Levers that keep the detections as they are before those that change them (a smaller
    --imgsz); within each, estimated gains first, largest first, then the others as given."""
    def key(lever: dict) -> tuple:
        gain = lever["bound_fps_after"]
        return lever.get("changes_results", False), gain is None, -(gain or 0.0)
    return sorted(levers, key=key)
