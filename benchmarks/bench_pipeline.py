"""The pipeline against the sequential detector, the bare model and the cores' decode rate,
measured side by side in one run, in the steady state.

    python benchmarks/bench_pipeline.py --quick                  # smoke check: does it all run?
    python benchmarks/bench_pipeline.py --rect --out rect.json   # pipeline fp32 vs python -m yolo --rect
    python benchmarks/bench_pipeline.py --square --out square.json   # pipeline --half vs yolo, 640 square
    python benchmarks/bench_pipeline.py --device cuda --batch-size 8

Contenders, each a command run on the same real frames (the photos of --images, copied in turn
into a temporary frame set of --frames files; longer runs loop over it):

  bare model loop, fp32 and --half   benchmarks/loops.py model: forward + candidate selection on
                                     tensors letterboxed beforehand, torch's default threads, at
                                     the pipeline's batch size
  python -m yolo, fp32 and --half    the sequential detector, torch's default threads (all cores)
  pipeline, defaults and --half      python runner.py
  model-free pipeline                python runner.py --preset none, images never saved
  decode+letterbox                   benchmarks/loops.py decode: one process per core

--half is fp16 on CUDA and bf16 on the CPU; on a CPU without bf16 instructions the tools refuse
it (exit 2) and the contender is reported unavailable with their reason, never run emulated.

Method. fps = (frames_long - frames_short) / (wall_long - wall_short): every contender runs
twice per round, a short and a long run, and the wall clock of each whole command is taken.
Start-up (imports, model load, process spawn, the first slow forwards) and shut-down (report
writing aside from its per-frame part) are the same in both runs and cancel; what is left is
the steady-state rate, measured the same way for every contender, the ones without a report of
their own included. Their own fps (the yolo line, the pipeline's report window, the loops' own
timers) are recorded beside it as a cross-check. Each contender's run lengths are sized once,
from a first untimed run that also warms the caches, so that the long run adds about --span-s
seconds of work: the fast contenders get as long a measured difference as the slow ones.
Contenders run round by round, the order rotating and short/long alternating, and the median
over rounds is reported; ratios are medians of per-round ratios (both ran in the same round).

Writes every figure as JSON with --out. Exit codes: 0 done; 1 a command failed; 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(os.path.dirname(REPO), "shared", "fixtures")
sys.path.insert(0, REPO)

from workers.host import usable_cores  # noqa: E402
from yolo.precision import has_native_bf16, read_cpu_flags  # noqa: E402  (torch-free)

from interleave import rotated  # noqa: E402  (benchmarks/: this script's folder)

PHOTO_SUFFIXES = (".jpg", ".jpeg", ".png")
DEFAULTS = {"frames": 144, "rounds": 5, "span_s": 10.0}
QUICK = {"frames": 8, "rounds": 1, "span_s": 1.5}
MIN_SHORT_FRAMES = 16  # the short run must get past the first, cold frames of every process
COMMAND_TIMEOUT_S = 1200.0
EXIT_USAGE = 2  # what the tools answer to an impossible precision
OWN_FPS_LINE = re.compile(r"(\d+) frames in ([\d.]+) s: ([\d.]+) fps")
MIB = 1024 * 1024
BUSY_LOAD_AVERAGE = 0.5  # before the first run: above it, other work shares the cores


@dataclass(frozen=True)
class Settings:
    weights: str
    photos: tuple[str, ...]
    frames: int
    rounds: int
    span_s: float
    imgsz: int
    rect: bool
    save_images: bool
    device: str
    batch_size: int
    pipeline_args: tuple[str, ...]
    backend: str
    out: str | None
    quick: bool

    @property
    def shape(self) -> str:
        return "rect" if self.rect else "square"


@dataclass(frozen=True)
class Contender:
    key: str
    label: str
    kind: str  # "loop", "yolo" or "pipeline": where its own fps and figures are read
    argv: tuple[str, ...]  # without the frame count and the output folder
    half: bool = False  # may be refused on this machine (exit 2): then unavailable, with the reason


@dataclass
class Run:
    """One command: its wall clock, its own fps, and for the pipeline the parts of its report used."""
    frames: int
    wall_s: float
    own_fps: float | None
    report: dict | None = None


@dataclass
class Measured:
    contender: Contender
    short: int = 0
    long: int = 0
    rounds: list[dict] = field(default_factory=list)  # {"short": Run, "long": Run}


class CommandFailed(RuntimeError):
    def __init__(self, argv: list[str], code: int | None, output: str):
        self.code, self.output = code, output
        tail = "\n".join(output.strip().splitlines()[-12:])
        super().__init__(f"expected exit code 0 from {' '.join(argv)}, got {code}:\n{tail}")

    def refusal(self) -> str:
        """The tool's own 'error: ...' line."""
        errors = [line for line in self.output.splitlines() if line.startswith("error: ")]
        return errors[-1][len("error: "):] if errors else self.output.strip().splitlines()[-1]


def parse_args(argv: list[str] | None = None) -> Settings:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--weights", default=os.path.join(FIXTURES, "yolov5n.pt"))
    p.add_argument("--images", default=FIXTURES, help="folder of photos copied in turn into the frame set")
    p.add_argument("--frames", type=int, help=f"files in the frame set (default {DEFAULTS['frames']})")
    p.add_argument("--rounds", type=int, help=f"measured rounds (default {DEFAULTS['rounds']})")
    p.add_argument("--span-s", type=float,
                   help=f"seconds of work the long run adds over the short one (default {DEFAULTS['span_s']})")
    p.add_argument("--imgsz", type=int, default=640)
    shape = p.add_mutually_exclusive_group()
    shape.add_argument("--rect", dest="rect", action="store_true", default=True, help="minimal padding (default)")
    shape.add_argument("--square", dest="rect", action="store_false", help="imgsz x imgsz letterbox")
    p.add_argument("--save-images", action=argparse.BooleanOptionalAction, default=True,
                   help="the detectors and the pipeline save annotated images (default: saved)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--batch-size", type=int, default=1, help="the pipeline's and the bare loop's batch")
    p.add_argument("--pipeline-args", default="", help="extra runner.py flags, e.g. '--workers 2'")
    p.add_argument("--backend", choices=("torch", "openvino"), default="torch",
                   help="the backend of the pipeline and python -m yolo contenders; with openvino, python -m yolo "
                        "on torch fp32 runs beside them as the baseline")
    p.add_argument("--out", help="write every figure to this JSON file")
    p.add_argument("--quick", action="store_true",
                   help=f"smoke configuration ({', '.join(f'{k} {v}' for k, v in QUICK.items())}): checks the "
                        "script works, the figures mean little")
    args = p.parse_args(argv)
    base = QUICK if args.quick else DEFAULTS
    settings = Settings(
        weights=args.weights, photos=tuple(find_photos(p, args.images)),
        frames=args.frames if args.frames is not None else base["frames"],
        rounds=args.rounds if args.rounds is not None else base["rounds"],
        span_s=args.span_s if args.span_s is not None else base["span_s"],
        imgsz=args.imgsz, rect=args.rect, save_images=args.save_images, device=args.device,
        batch_size=args.batch_size, pipeline_args=tuple(args.pipeline_args.split()), backend=args.backend,
        out=args.out, quick=args.quick)
    check_settings(p, settings)
    return settings


def find_photos(p: argparse.ArgumentParser, folder: str) -> list[str]:
    if not os.path.isdir(folder):
        p.error(f"--images: expected a folder of photos, got {folder!r}")
    photos = sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.lower().endswith(PHOTO_SUFFIXES))
    if not photos:
        p.error(f"--images: expected {', '.join(PHOTO_SUFFIXES)} files in {folder!r}, got none")
    return photos


def check_settings(p: argparse.ArgumentParser, s: Settings) -> None:
    if not os.path.isfile(s.weights):
        p.error(f"--weights: expected a checkpoint file, got {s.weights!r}")
    if s.frames < 1:
        p.error(f"--frames: expected >= 1, got {s.frames}")
    if s.rounds < 1:
        p.error(f"--rounds: expected >= 1, got {s.rounds}")
    if not s.span_s > 0:
        p.error(f"--span-s: expected > 0, got {s.span_s}")
    if s.imgsz <= 0 or s.imgsz % 32:
        p.error(f"--imgsz: expected a positive multiple of 32, got {s.imgsz}")
    if s.batch_size < 1:
        p.error(f"--batch-size: expected >= 1, got {s.batch_size}")


def make_frame_set(photos: tuple[str, ...], count: int) -> str:
    folder = tempfile.mkdtemp(prefix="bench-frames-")
    for i in range(count):
        photo = photos[i % len(photos)]
        shutil.copy(photo, os.path.join(folder, f"{i:04d}_{os.path.basename(photo)}"))
    return folder


def contenders(s: Settings, frames_dir: str) -> list[Contender]:
    py = sys.executable
    shape = ("--imgsz", str(s.imgsz), "--rect" if s.rect else "--square")
    bare = (py, "benchmarks/loops.py", "model", "--weights", s.weights, "--images", *s.photos, "--device", s.device,
            "--batch-size", str(s.batch_size), *shape)
    yolo = (py, "-m", "yolo", "--weights", s.weights, "--source", frames_dir, "--device", s.device, "--quiet", *shape)
    runner = (py, "runner.py", "--source", frames_dir, "--device", s.device, "--batch-size", str(s.batch_size),
              "--no-progress", *shape)
    pipeline = (*runner, "--weights", s.weights, "--save-images", "all" if s.save_images else "none",
                *s.pipeline_args)
    half = "fp16" if s.device.startswith("cuda") else "bf16"
    if s.backend != "torch":
        return backend_contenders(s, yolo, pipeline, half)
    return [
        Contender("bare_fp32", f"bare model loop fp32, batch {s.batch_size}", "loop", bare),
        Contender("bare_half", f"bare model loop {half}, batch {s.batch_size}", "loop", (*bare, "--half"), half=True),
        Contender("yolo_fp32", "python -m yolo fp32", "yolo", yolo),
        Contender("yolo_half", "python -m yolo --half", "yolo", (*yolo, "--half"), half=True),
        Contender("pipeline_fp32", f"pipeline, runner.py {' '.join(s.pipeline_args) or 'defaults'}", "pipeline",
                  pipeline),
        Contender("pipeline_half", "pipeline --half", "pipeline", (*pipeline, "--half"), half=True),
        Contender("ceiling", "model-free pipeline (--preset none)", "pipeline",
                  (*runner, "--preset", "none", "--save-images", "none", *s.pipeline_args)),
        Contender("decode", f"decode+letterbox, {usable_cores()} processes", "loop",
                  (py, "benchmarks/loops.py", "decode", "--source", frames_dir, *shape)),
    ]


def backend_contenders(s: Settings, yolo: tuple, pipeline: tuple, half: str) -> list[Contender]:
    """Another backend's pipeline and sequential detector, fp32 and --half, beside the sequential
    detector on torch fp32, the baseline its goals are quoted against."""
    flag = ("--backend", s.backend)
    return [
        Contender("yolo_torch_fp32", "python -m yolo fp32 (torch)", "yolo", yolo),
        Contender("yolo_fp32", f"python -m yolo --backend {s.backend} fp32", "yolo", (*yolo, *flag)),
        Contender("yolo_half", f"python -m yolo --backend {s.backend} --half", "yolo", (*yolo, *flag, "--half"),
                  half=True),
        Contender("pipeline_fp32", f"pipeline --backend {s.backend} fp32", "pipeline", (*pipeline, *flag)),
        Contender("pipeline_half", f"pipeline --backend {s.backend} --half ({half})", "pipeline",
                  (*pipeline, *flag, "--half"), half=True),
    ]


def command(c: Contender, frames: int, scratch: str, save_images: bool) -> list[str]:
    argv = [*c.argv, "--frames", str(frames)]
    if c.kind == "yolo" and save_images:
        argv += ["--save-dir", os.path.join(scratch, "images")]
    if c.kind == "pipeline":
        argv += ["--results", os.path.join(scratch, "results")]
    return argv


def run_once(c: Contender, frames: int, save_images: bool) -> Run:
    """Run ``c`` for ``frames`` frames; its outputs go to a scratch folder removed afterwards."""
    scratch = tempfile.mkdtemp(prefix=f"bench-{c.key}-")
    try:
        argv = command(c, frames, scratch, save_images)
        t0 = time.perf_counter()
        try:
            done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            raise CommandFailed(argv, None, f"timed out after {COMMAND_TIMEOUT_S:.0f} s\n{exc.stderr or ''}") from None
        wall_s = time.perf_counter() - t0
        output = done.stdout + done.stderr
        if done.returncode:
            raise CommandFailed(argv, done.returncode, output)
        if c.kind == "pipeline":
            report = pipeline_figures(os.path.join(scratch, "results", "latest", "report.json"))
            check_count(argv, frames, report["processed"], output)
            return Run(frames, wall_s, report["fps"], report)
        own = OWN_FPS_LINE.findall(output)
        if not own:
            raise CommandFailed(argv, 0, f"expected a line 'N frames in S s: F fps', got none\n{output}")
        check_count(argv, frames, int(own[-1][0]), output)
        return Run(frames, wall_s, float(own[-1][2]))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def check_count(argv: list[str], expected: int, got: int, output: str) -> None:
    if got != expected:
        raise CommandFailed(argv, 0, f"expected {expected} frames processed, got {got}\n{output}")


def pipeline_figures(path: str) -> dict:
    """What the benchmark keeps of a pipeline run's report.json."""
    with open(path, encoding="utf-8") as f:
        report = json.load(f)
    summary = report["summary"]
    return {"processed": summary["processed"], "fps": summary["fps"], "startup_s": report["environment"]["startup_s"],
            "peak_pss_total_bytes": summary["peak_pss_total_bytes"],
            "peak_pss_bytes": {name: p["peak_pss_bytes"] for name, p in report["resources"]["processes"].items()},
            "bound_fps": summary["bound_fps"], "bottleneck": summary["bottleneck"],
            "images_saved": summary["images_saved"]}


def run_lengths(own_fps: float, s: Settings) -> tuple[int, int]:
    """(short, long) frame counts: the long run adds about ``span_s`` seconds at ``own_fps``,
    the short one is half that long; both whole batches."""
    span = max(MIN_SHORT_FRAMES, math.ceil(own_fps * s.span_s))
    short = max(MIN_SHORT_FRAMES, math.ceil(span / 2))
    return whole_batches(short, s.batch_size), whole_batches(short + span, s.batch_size)


def whole_batches(frames: int, batch_size: int) -> int:
    return math.ceil(frames / batch_size) * batch_size


def probe(cs: list[Contender], s: Settings) -> tuple[list[Measured], dict[str, str]]:
    """One untimed run of each contender over the frame set: it warms the caches, sizes the
    contender's run lengths from its own fps, and finds the ones this machine refuses."""
    measured, unavailable = [], {}
    for c in cs:
        try:
            first = run_once(c, s.frames, s.save_images)
        except CommandFailed as exc:
            if c.half and exc.code == EXIT_USAGE:
                unavailable[c.key] = exc.refusal()
                print(f"  {c.label}: unavailable: {short_reason(unavailable[c.key])}", flush=True)
                continue
            raise
        estimate = first.own_fps or first.frames / first.wall_s
        short, long = run_lengths(estimate, s)
        measured.append(Measured(c, short, long))
        print(f"  {c.label}: {estimate:.1f} fps of its own over {first.frames} frames; measured at {short} and "
              f"{long} frames", flush=True)
    return measured, unavailable


def measure_rounds(measured: list[Measured], s: Settings) -> list[float]:
    """Run the rounds; the 1-minute load average after each (this benchmark's own load included)."""
    loads = []
    for r in range(s.rounds):
        for m in rotated(measured, r):
            lengths = ("short", "long") if r % 2 == 0 else ("long", "short")
            runs = {which: run_once(m.contender, getattr(m, which), s.save_images) for which in lengths}
            m.rounds.append(runs)
        loads.append(os.getloadavg()[0])
        print(f"round {r + 1}/{s.rounds}: " + ", ".join(
            f"{m.contender.key} {fmt(round_fps(m.rounds[-1]))}" for m in measured) + f" fps; load {loads[-1]:.2f}",
            flush=True)
    return loads


def round_fps(runs: dict[str, Run]) -> float | None:
    """The steady-state fps of one round; None when noise made the long run no longer."""
    extra_s = runs["long"].wall_s - runs["short"].wall_s
    return (runs["long"].frames - runs["short"].frames) / extra_s if extra_s > 0 else None


def median(values) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def contender_result(m: Measured, s: Settings) -> dict:
    per_round = [round_fps(runs) for runs in m.rounds]
    fixed = [runs["short"].wall_s - runs["short"].frames / fps for runs, fps in zip(m.rounds, per_round) if fps]
    kept = [f for f in per_round if f is not None]
    result = {"label": m.contender.label, "available": True, "frames_short": m.short, "frames_long": m.long,
              "command": command(m.contender, m.long, "SCRATCH", s.save_images),
              "fps": median(per_round), "fps_min": min(kept, default=None), "fps_max": max(kept, default=None),
              "fps_per_round": per_round, "fixed_s": median(fixed),
              "own_fps": median(runs["long"].own_fps for runs in m.rounds),
              "wall_s_per_round": [{"short": runs["short"].wall_s, "long": runs["long"].wall_s} for runs in m.rounds]}
    if m.contender.kind == "pipeline":
        result.update(pipeline_result(m))
    return result


def pipeline_result(m: Measured) -> dict:
    """Start-up over every run; memory of the long run with the largest total (the worst seen)."""
    reports = [runs[which].report for runs in m.rounds for which in ("short", "long")]
    longs = [runs["long"].report for runs in m.rounds]
    worst = max(longs, key=lambda r: r["peak_pss_total_bytes"] or 0)
    return {"startup_s": median(r["startup_s"] for r in reports),
            "peak_pss_total_bytes": worst["peak_pss_total_bytes"], "peak_pss_bytes": worst["peak_pss_bytes"],
            "report": {k: median(r[k] for r in longs) for k in ("fps", "bound_fps")} | {
                "bottleneck": longs[-1]["bottleneck"], "images_saved_last_long_run": longs[-1]["images_saved"]}}


RATIOS = (  # key, numerator, denominator, the setting the target is quoted at (None: any)
    ("pipeline_fp32/yolo_torch_fp32", "pipeline_fp32", "yolo_torch_fp32", None),
    ("pipeline_half/yolo_torch_fp32", "pipeline_half", "yolo_torch_fp32", None),
    ("pipeline_half/yolo_fp32", "pipeline_half", "yolo_fp32", ("square", True)),
    ("pipeline_half/yolo_half", "pipeline_half", "yolo_half", ("square", True)),
    ("pipeline_fp32/yolo_fp32", "pipeline_fp32", "yolo_fp32", ("rect", True)),
    ("ceiling/decode", "ceiling", "decode", ("rect", None)),
    ("pipeline_fp32/bare_fp32", "pipeline_fp32", "bare_fp32", None),
    ("pipeline_half/bare_half", "pipeline_half", "bare_half", None),
)


def ratios(measured: list[Measured], unavailable: dict[str, str], s: Settings) -> dict:
    """Medians of per-round ratios; a ratio with an unavailable side says why."""
    per_round = {m.contender.key: [round_fps(runs) for runs in m.rounds] for m in measured}
    result = {}
    for key, top, bottom, target in RATIOS:
        if any(k not in per_round and k not in unavailable for k in (top, bottom)):
            continue  # a contender this run does not have
        entry: dict = {"numerator": top, "denominator": bottom}
        if target:
            shape, saved = target
            entry["target_setting"] = f"640 {shape}" + ("" if saved is None else ", images saved")
            entry["at_target_setting"] = (s.imgsz == 640 and s.shape == shape
                                          and (saved is None or s.save_images == saved))
        missing = [k for k in (top, bottom) if k in unavailable]
        if missing:
            entry.update(value=None, reason="; ".join(f"{k} unavailable: {unavailable[k]}" for k in missing))
        else:
            pairs = [a / b for a, b in zip(per_round[top], per_round[bottom]) if a and b]
            entry.update(value=statistics.median(pairs) if pairs else None,
                         reason=None if pairs else "no round where both gave a steady-state fps")
        result[key] = entry
    return result


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    except OSError:
        names = []
    return names[0] if names else platform.processor() or platform.machine()


def machine() -> dict:
    return {"cores": usable_cores(), "cpu": cpu_model(), "native_bf16": has_native_bf16(read_cpu_flags()),
            "python": platform.python_version(), "platform": platform.platform()}


def fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def mib(nbytes: int | None) -> str:
    return "-" if nbytes is None else f"{nbytes / MIB:.0f}"


def short_reason(reason: str) -> str:
    """A refusal's first clause, for the table; the JSON keeps it whole."""
    return reason.removeprefix("config half: ").split(";")[0]


def print_results(result: dict) -> None:
    s, cs = result["settings"], result["contenders"]
    print(f"\n{s['frames']}-file frame set of {', '.join(os.path.basename(p) for p in s['photos'])}; "
          f"{s['imgsz']} {s['shape']}, images {'saved' if s['save_images'] else 'not saved'}; {s['device']}, batch "
          f"{s['batch_size']}; {result['machine']['cores']} cores ({result['machine']['cpu']}); {s['rounds']} rounds; "
          f"load average {result['load_average']['start'][0]:.2f} at the start, {result['load_average']['end'][0]:.2f} "
          f"at the end")
    if result["load_average"]["start"][0] > BUSY_LOAD_AVERAGE:
        print(f"note: the load average was {result['load_average']['start'][0]:.2f} before the first run: other work "
              "shares these cores, so the figures are noisy (multi-threaded torch, the sequential detector's and the "
              "bare loop's, suffers most)")
    print("fps = (frames_long - frames_short) / (wall_long - wall_short) of each whole command; median of rounds "
          "[min .. max]; fixed s = start-up + shut-down; own fps = the tool's own figure (long runs)\n")
    print(f"{'contender':40s} {'frames':>11s} {'fps':>8s} {'[min .. max]':>17s} {'fixed s':>8s} {'own fps':>8s}")
    for c in cs.values():
        if not c["available"]:
            print(f"{c['label']:40s} unavailable: {short_reason(c['reason'])}")
            continue
        spread = f"[{fmt(c['fps_min'])} .. {fmt(c['fps_max'])}]"
        print(f"{c['label']:40s} {c['frames_short']:>5d}/{c['frames_long']:<5d} {fmt(c['fps']):>8s} {spread:>17s} "
              f"{fmt(c['fixed_s'], 1):>8s} {fmt(c['own_fps']):>8s}")
    for c in cs.values():
        if c["available"] and "startup_s" in c:
            own = c["report"]
            sizes = sorted(((b, name) for name, b in c["peak_pss_bytes"].items() if b), reverse=True)
            print(f"\n{c['label']}: start-up {fmt(c['startup_s'])} s (environment.startup_s, median of its runs); "
                  f"its report (long runs): {fmt(own['fps'])} fps over its window, bound {fmt(own['bound_fps'])} fps, "
                  f"busiest stage {own['bottleneck']}")
            print(f"  peak PSS of the sum {mib(c['peak_pss_total_bytes'])} MiB; per process, MiB: "
                  + ", ".join(f"{name} {mib(b)}" for b, name in sizes))
    print("\nratios (median over rounds of the per-round ratio):")
    for key, r in result["ratios"].items():
        where = ""
        if "target_setting" in r:
            where = f"  [target quoted at {r['target_setting']}{'' if r['at_target_setting'] else '; not this run'}]"
        missing = [k for k in (r["numerator"], r["denominator"]) if not cs[k]["available"]]
        value = (fmt(r["value"], 3) if r["value"] is not None else
                 f"unavailable: {', '.join(missing)} refused" if missing else f"unavailable: {r['reason']}")
        print(f"  {key:26s} {value}{where}")


def main(argv: list[str] | None = None) -> int:
    s = parse_args(argv)
    load_start = os.getloadavg()
    frames_dir = make_frame_set(s.photos, s.frames)
    try:
        cs = contenders(s, frames_dir)
        print(f"first runs over the {s.frames}-file frame set (untimed: caches, run lengths, availability):")
        measured, unavailable = probe(cs, s)
        round_loads = measure_rounds(measured, s)
    except CommandFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(frames_dir, ignore_errors=True)
    by_key = {m.contender.key: m for m in measured}
    result = {
        "settings": {**asdict(s), "shape": s.shape},
        "method": "fps = (frames_long - frames_short) / (wall_long - wall_short), wall clock of each whole command, "
                  "median over interleaved rounds; ratios are medians of per-round ratios",
        "machine": machine(),
        "load_average": {"start": list(load_start), "after_each_round": round_loads, "end": list(os.getloadavg())},
        "contenders": {c.key: contender_result(by_key[c.key], s) if c.key in by_key else
                       {"label": c.label, "available": False, "reason": unavailable[c.key]} for c in cs},
        "ratios": ratios(measured, unavailable, s),
    }
    print_results(result)
    if s.out:
        with open(s.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
        print(f"\nwritten: {s.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
