"""How the CPU pipeline grows with cores, against the sequential detector on the same cores.

    python benchmarks/bench_cores.py --cores 4,8,16 --out cores.json
    python benchmarks/bench_cores.py --dry                             # tiny: checks it runs

For each core count N, both tools run confined to cores 0..N-1 (the CPU affinity mask, as
``taskset`` sets it; the runner sizes its default worker counts from the mask, and torch's
thread pool follows it): ``runner.py --device cpu`` with its defaults, and ``python -m yolo``
(torch's default threads on those cores). Every (N, tool) pair runs once per round, the order
rotating each round. fps is each tool's own figure (the pipeline's measured window; the
detector's own line); ratios are medians of per-round ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench_gpu import FIXTURES, make_frame_set, median  # noqa: E402  (benchmarks/: this script's folder)
from bench_pipeline import OWN_FPS_LINE, fmt  # noqa: E402
from pipeline_print import cpu_model  # noqa: E402
from interleave import rotated, rounds_within  # noqa: E402

from yolo.precision import read_cpu_flags  # noqa: E402

COMMAND_TIMEOUT_S = 300.0
QUOTED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cores", default=None, help="core counts, e.g. 4,8,16 (default: 2, 4, ... up to all)")
    p.add_argument("--weights", default=os.path.join(FIXTURES, "yolov5n.pt"))
    p.add_argument("--images", default=FIXTURES)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--duration-s", type=float, default=5.0, help="each pipeline run's --duration")
    p.add_argument("--yolo-s", type=float, default=5.0, help="about how long each python -m yolo run lasts")
    p.add_argument("--budget-s", type=float, default=240.0, help="no round starts that would end past this")
    p.add_argument("--out")
    p.add_argument("--dry", action="store_true")
    a = p.parse_args(argv)
    available = sorted(os.sched_getaffinity(0))
    if a.cores:
        a.cores = [int(n) for n in a.cores.split(",")]
    else:
        a.cores = [n for n in (2, 4, 8, 16, 32, 64) if n < len(available)] + [len(available)]
    if a.dry:
        a.cores, a.rounds, a.duration_s, a.yolo_s = [1, len(available)], 1, 1.0, 1.0
    if max(a.cores) > len(available) or min(a.cores) < 1:
        p.error(f"--cores: expected counts from 1 to {len(available)}, got {a.cores}")
    a.core_ids = available
    return a


def run_confined(argv: list[str], cores: list[int]) -> tuple[int, str, float]:
    t0 = time.perf_counter()
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S,
                          preexec_fn=lambda: os.sched_setaffinity(0, cores))
    return done.returncode, done.stdout + done.stderr, time.perf_counter() - t0


def pipeline_run(a, frames: str, n: int) -> dict:
    scratch = tempfile.mkdtemp(prefix="bench-cores-")
    try:
        code, out, wall = run_confined([sys.executable, "runner.py", "--weights", a.weights, "--source", frames,
                                        "--device", "cpu", "--duration", f"{a.duration_s:g}", "--json",
                                        "--no-progress", "--results", scratch], a.core_ids[:n])
        if code not in (0, 3):
            return {"ok": False, "error": out[-1500:], "wall_s": wall}
        with open(os.path.join(scratch, "latest", "report.json"), encoding="utf-8") as f:
            report = json.load(f)
        s = report["summary"]
        return {"ok": True, "wall_s": wall, "fps": s["fps"], "cpu_ms_per_frame": s["cpu_ms_per_frame"],
                "cpu_saturation": s["cpu_saturation"], "bound_fps": s["bound_fps"], "bottleneck": s["bottleneck"],
                "limit": s["limit"], "workers": {r: st["workers"] for r, st in s["stages"].items()},
                "infer_cpu_ms_per_frame": s["stages"]["infer"]["cpu_ms_per_frame"]}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def yolo_run(a, frames: str, n: int, fps_guess: float) -> dict:
    scratch = tempfile.mkdtemp(prefix="bench-cores-")
    count = max(8, round(fps_guess * a.yolo_s))
    try:
        code, out, wall = run_confined([sys.executable, "-m", "yolo", "--weights", a.weights, "--source", frames,
                                        "--device", "cpu", "--quiet", "--frames", str(count), "--save-dir",
                                        os.path.join(scratch, "images")], a.core_ids[:n])
        own = OWN_FPS_LINE.findall(out)
        if code or not own:
            return {"ok": False, "error": out[-1500:], "wall_s": wall}
        return {"ok": True, "wall_s": wall, "fps": float(own[-1][2]), "frames": count}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def summarise(a, rounds: list[dict]) -> dict:
    rows = []
    for n in a.cores:
        pipe = [r[f"pipeline@{n}"] for r in rounds if r.get(f"pipeline@{n}", {}).get("ok")]
        yolo = [r[f"yolo@{n}"] for r in rounds if r.get(f"yolo@{n}", {}).get("ok")]
        pairs = [r[f"pipeline@{n}"]["fps"] / r[f"yolo@{n}"]["fps"] for r in rounds
                 if r.get(f"pipeline@{n}", {}).get("ok") and r.get(f"yolo@{n}", {}).get("ok")]
        rows.append({"cores": n, "pipeline_fps": median(p["fps"] for p in pipe),
                     "yolo_fps": median(y["fps"] for y in yolo), "pipeline/yolo": median(pairs),
                     "pipeline_cpu_ms_per_frame": median(p["cpu_ms_per_frame"] for p in pipe),
                     "pipeline_infer_cpu_ms_per_frame": median(p["infer_cpu_ms_per_frame"] for p in pipe),
                     "pipeline_workers": pipe[-1]["workers"] if pipe else None,
                     "pipeline_limit": pipe[-1]["limit"] if pipe else None})
    base = rows[0]
    for row in rows:
        for tool in ("pipeline", "yolo"):
            got, first = row[f"{tool}_fps"], base[f"{tool}_fps"]
            row[f"{tool}_speedup_vs_{base['cores']}_cores"] = got / first if got and first else None
    flags = read_cpu_flags()
    return {"machine": {"cpu": cpu_model(), "cores": len(a.core_ids), "flags": [f for f in QUOTED_FLAGS if f in flags]},
            "settings": {"cores": a.cores, "rounds": len(rounds), "duration_s": a.duration_s, "yolo_s": a.yolo_s,
                         "weights": os.path.basename(a.weights), "frames": "fixture photos at 0.5x, 1x, 1.5x",
                         "imgsz": 640, "shape": "rect", "images": "saved"},
            "rows": rows, "runs": rounds}


def print_rows(result: dict) -> None:
    m = result["machine"]
    print(f"\nCPU scaling: {m['cpu']}, {m['cores']} cores usable, flags {' '.join(m['flags'])}; yolov5n 640 rect, "
          f"images saved, {result['settings']['rounds']} rounds")
    print(f"{'cores':>5} {'pipeline fps':>13} {'python -m yolo fps':>19} {'ratio':>6} {'pipe speedup':>13} "
          f"{'yolo speedup':>13} {'CPU-ms/frame':>13}  limit")
    base = result["rows"][0]["cores"]
    for r in result["rows"]:
        print(f"{r['cores']:>5} {fmt(r['pipeline_fps'], 1):>13} {fmt(r['yolo_fps'], 1):>19} "
              f"{fmt(r['pipeline/yolo']):>6} {fmt(r[f'pipeline_speedup_vs_{base}_cores']):>13} "
              f"{fmt(r[f'yolo_speedup_vs_{base}_cores']):>13} {fmt(r['pipeline_cpu_ms_per_frame'], 1):>13}  "
              f"{r['pipeline_limit']}")


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    t_start = time.perf_counter()
    frames = make_frame_set(a.images)
    pairs = [(tool, n) for n in a.cores for tool in ("pipeline", "yolo")]
    rounds: list[dict] = []
    guesses: dict[int, float] = {}
    try:
        for r in rounds_within(a.rounds, a.budget_s, t_start):
            rounds.append({})
            for tool, n in rotated(pairs, r):
                got = pipeline_run(a, frames, n) if tool == "pipeline" else yolo_run(a, frames, n, guesses.get(n, 4.0 * n))
                if tool == "yolo" and got.get("ok"):
                    guesses[n] = got["fps"]
                rounds[-1][f"{tool}@{n}"] = got
                print(f"round {r + 1} {tool} on {n} cores: {'ok' if got['ok'] else 'FAILED'} {fmt(got.get('fps'), 1)} "
                      f"fps ({got['wall_s']:.1f} s)", flush=True)
                if a.out:
                    with open(a.out, "w", encoding="utf-8") as f:
                        json.dump(summarise(a, rounds), f, indent=1)
    finally:
        shutil.rmtree(frames, ignore_errors=True)
    result = summarise(a, rounds)
    print_rows(result)
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    return 0 if all(r.get("ok") for rr in rounds for r in rr.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
