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

import json
import math
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# benchmarks/ (this script's folder) is on sys.path: its modules import as top-level names
from interleave import rotated  # noqa: E402
from pipeline_plan import EFFICIENCY_GOAL, GOALS, MATRIX_RATIOS, RATIOS, REPO, Contender, Settings, contenders, parse_args  # noqa: E402
from pipeline_print import fmt, machine, print_results, short_reason  # noqa: E402

MIN_SHORT_FRAMES = 16  # the short run must get past the first, cold frames of every process
COMMAND_TIMEOUT_S = 1200.0
EXIT_USAGE = 2  # what the tools answer to an impossible precision
OWN_FPS_LINE = re.compile(r"(\d+) frames in ([\d.]+) s: ([\d.]+) fps")


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


def make_frame_set(photos: tuple[str, ...], count: int) -> str:
    folder = tempfile.mkdtemp(prefix="bench-frames-")
    for i in range(count):
        photo = photos[i % len(photos)]
        shutil.copy(photo, os.path.join(folder, f"{i:04d}_{os.path.basename(photo)}"))
    return folder


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
            "bound_fps": summary["bound_fps"], "efficiency": summary["efficiency"], "bottleneck": summary["bottleneck"],
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
              "own_fps_per_round": [runs["long"].own_fps for runs in m.rounds],
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
            "report": {k: median(r[k] for r in longs) for k in ("fps", "bound_fps", "efficiency")} | {
                "bottleneck": longs[-1]["bottleneck"], "images_saved_last_long_run": longs[-1]["images_saved"],
                "steady_efficiency": steady_efficiency(m), "efficiency_goal": EFFICIENCY_GOAL}}


def steady_efficiency(m: Measured) -> float | None:
    """This benchmark's steady-state fps over the bound the long run's report computed, median
    over rounds: the report's own efficiency counts its window, start-up's tail included."""
    return median(fps / runs["long"].report["bound_fps"] for runs in m.rounds
                  if (fps := round_fps(runs)) and runs["long"].report["bound_fps"])


def ratios(measured: list[Measured], unavailable: dict[str, str], s: Settings) -> dict:
    """Medians of per-round ratios; a ratio with an unavailable side says why."""
    per_round = {m.contender.key: [round_fps(runs) for runs in m.rounds] for m in measured}
    own_per_round = {m.contender.key: [runs["long"].own_fps for runs in m.rounds] for m in measured}
    result = {}
    for key, top, bottom, target in RATIOS + MATRIX_RATIOS:
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
            # the same from each long run's own figure: no difference of two runs, so less noise
            # where other work comes and goes, but start-up's tail counts in some tools' figures
            own = [a / b for a, b in zip(own_per_round[top], own_per_round[bottom]) if a and b]
            entry["own_fps_value"] = statistics.median(own) if own else None
        if key in GOALS:
            entry.update(goal=GOALS[key], meets_goal=None if entry["value"] is None else entry["value"] >= GOALS[key])
        result[key] = entry
    return result


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
        "command": shlex.join(["python", "benchmarks/bench_pipeline.py", *(sys.argv[1:] if argv is None else argv)]),
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
