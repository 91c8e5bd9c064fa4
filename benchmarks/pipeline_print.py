"""bench_pipeline.py's printing: the machine it ran on and the table of results."""

from __future__ import annotations

import os
import platform

from pipeline_plan import MATRIX_RATIOS
from analysis.machine import usable_cores
from yolo.precision import has_native_bf16, read_cpu_flags  # torch-free

MIB = 1024 * 1024
BUSY_LOAD_AVERAGE = 0.5  # before the first run: above it, other work shares the cores
MATRIX_KEYS = {key for key, *_ in MATRIX_RATIOS}
SIMD_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")  # what the forwards use


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    except OSError:
        names = []
    return names[0] if names else platform.processor() or platform.machine()


def machine() -> dict:
    flags = read_cpu_flags()
    return {"cores": usable_cores(), "cpu": cpu_model(), "native_bf16": has_native_bf16(flags),
            "cpu_flags": [f for f in SIMD_FLAGS if flags and f in flags],
            "python": platform.python_version(), "platform": platform.platform()}


def cpu_flags(machine_figures: dict) -> str:
    """", flags avx2 avx512f ...": the SIMD flags the forwards can use; "" in older results without them."""
    flags = machine_figures.get("cpu_flags")
    return f", flags {' '.join(flags) if flags else 'none of ' + ' '.join(SIMD_FLAGS)}" if flags is not None else ""


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
          f"{s['batch_size']}; {result['machine']['cores']} cores ({result['machine']['cpu']}{cpu_flags(result['machine'])}); "
          f"{s['rounds']} rounds; "
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
            if "steady_efficiency" in own:
                print(f"  efficiency: {fmt(own['efficiency'])} by its report, {fmt(own['steady_efficiency'])} as this "
                      f"benchmark's fps / its report's bound (goal >= {own['efficiency_goal']:.2f})")
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
        if key in MATRIX_KEYS and r.get("own_fps_value") is not None:
            where += f"  (own fps: {r['own_fps_value']:.3f})"
        if "goal" in r:
            where += f"  [goal >= {r['goal']:g}: {'-' if r['meets_goal'] is None else 'met' if r['meets_goal'] else 'missed'}]"
        print(f"  {key:26s} {value}{where}")

