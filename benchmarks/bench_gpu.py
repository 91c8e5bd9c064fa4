"""The pipeline on a GPU against the bare model loop and the sequential detector, side by side.

    python benchmarks/bench_gpu.py --device cuda --out gpu.json        # on a GPU machine
    python benchmarks/bench_gpu.py --device cpu --dry                  # the same contenders, tiny: checks it runs

Contenders, each a whole command, run once per round, the order rotating each round:

  bare model loop      benchmarks/model_rates.py: forward only, inputs already on the device, CUDA
                       events; batch 1, 8, 32; fp16 and fp32; cuDNN autotuning off and on
  python -m yolo       the sequential detector, fp32 and --half, annotated images saved
  pipeline             runner.py at batch 1, 8, 32 in fp16 and fp32 with default worker counts (the
                       data path the device's default: device on CUDA); the design card's command
                       (--workers 4, nothing else); more inference processes per GPU;
                       --module-timing none (what CUDA-event timing costs); images not saved;
                       synthetic frames; --data-path host and device side by side; --cuda-graphs
                       at batch 1 and the top batch (CUDA only)

Frames: the fixture photos at several sizes (0.5x, 1x, 1.5x), looped. fps is each tool's own
figure: the pipeline's measured window (report.json; start-up, the first forward of each shape
and shut-down left out), the loops' own timers, ``python -m yolo``'s own line. Ratios are
medians of per-round ratios (both sides ran in the same round). --budget-s stops starting new
rounds when the next would not fit; what was measured is written after every command.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(os.path.dirname(REPO), "shared", "fixtures")
sys.path.insert(0, REPO)

from bench_pipeline import OWN_FPS_LINE, fmt  # noqa: E402  (benchmarks/: this script's folder)
from pipeline_print import cpu_model  # noqa: E402
from interleave import rotated, rounds_within  # noqa: E402

SCALES = (0.5, 1.0, 1.5)
FRAME_SET_PREFIX = "bench-gpu-frames-"
COMMAND_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Settings:
    device: str
    weights: str
    images: str
    rounds: int
    duration_s: float
    yolo_frames: int
    batch_sizes: tuple[int, ...]
    budget_s: float
    out: str | None
    dry: bool
    only: tuple[str, ...] = ()


@dataclass(frozen=True)
class Contender:
    key: str
    label: str
    kind: str  # "loop", "yolo" or "pipeline"
    argv: tuple[str, ...]
    batch: int = 1
    precision: str = "fp32"


def parse_args(argv: list[str] | None = None) -> Settings:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--weights", default=os.path.join(FIXTURES, "yolov5n.pt"))
    p.add_argument("--images", default=FIXTURES, help="folder of photos, resized into the frame set")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--duration-s", type=float, default=4.0, help="each pipeline run's --duration")
    p.add_argument("--yolo-frames", type=int, default=300, help="frames of each python -m yolo run")
    p.add_argument("--batch-sizes", default="1,8,32")
    p.add_argument("--budget-s", type=float, default=420.0, help="no round starts that would end past this")
    p.add_argument("--out", help="write every figure to this JSON file (after every command)")
    p.add_argument("--only", default="", help="comma-separated contender keys to run (default: all), e.g. "
                                              "bare,yolo_fp16,pipe_b8_fp16")
    p.add_argument("--dry", action="store_true", help="tiny runs: checks the script, the figures mean nothing")
    a = p.parse_args(argv)
    if not os.path.isfile(a.weights):
        p.error(f"--weights: expected a checkpoint file, got {a.weights!r}")
    if a.rounds < 1 or a.duration_s <= 0 or a.yolo_frames < 1:
        p.error("--rounds, --duration-s and --yolo-frames: expected > 0")
    batches = tuple(int(b) for b in a.batch_sizes.split(","))
    only = tuple(k.strip() for k in a.only.split(",") if k.strip())
    if a.dry:
        return Settings(a.device, a.weights, a.images, 1, 1.0, 4, (1, 2), a.budget_s, a.out, True, only)
    return Settings(a.device, a.weights, a.images, a.rounds, a.duration_s, a.yolo_frames, batches, a.budget_s,
                    a.out, False, only)


def photos_in(images: str) -> list[str]:
    photos = sorted(f for f in os.listdir(images) if f.lower().endswith((".jpg", ".jpeg", ".png")))
    if not photos:
        raise SystemExit(f"error: --images: expected photos in {images!r}, got none")
    return photos


def make_frame_set(images: str) -> str:
    """The photos of ``images`` at each of SCALES, as JPEG files in a temporary folder."""
    import cv2
    photos = photos_in(images)
    folder = tempfile.mkdtemp(prefix=FRAME_SET_PREFIX)
    for name in photos:
        image = cv2.imread(os.path.join(images, name))
        for scale in SCALES:
            size = (round(image.shape[1] * scale), round(image.shape[0] * scale))
            resized = image if scale == 1 else cv2.resize(image, size, interpolation=cv2.INTER_AREA)
            cv2.imwrite(os.path.join(folder, f"{os.path.splitext(name)[0]}_{size[0]}x{size[1]}.jpg"), resized)
    return folder


def contenders(s: Settings, frames: str) -> list[Contender]:
    py, half = sys.executable, half_precision(s.device)
    half_flag = ("--half",) if half != "fp32" else ()
    small = s.dry
    photo = os.path.join(s.images, photos_in(s.images)[0])
    loop = (py, "benchmarks/model_rates.py", "--weights", s.weights, "--images", photo,
            "--device", s.device, "--batch-sizes", ",".join(map(str, s.batch_sizes)),
            "--precisions", ",".join(dict.fromkeys((half, "fp32"))), "--rounds", "2", "--forwards", "2" if small else "50")
    yolo = (py, "-m", "yolo", "--weights", s.weights, "--source", frames, "--device", s.device, "--quiet",
            "--frames", str(s.yolo_frames))
    runner = (py, "runner.py", "--weights", s.weights, "--source", frames, "--device", s.device,
              "--duration", f"{s.duration_s:g}", "--json", "--no-progress")
    out = [Contender("bare", "bare model loop (forward only)", "loop", loop),
           Contender("yolo_fp32", "python -m yolo fp32", "yolo", yolo)]
    if half != "fp32":
        out.append(Contender(f"yolo_{half}", f"python -m yolo --half ({half})", "yolo", (*yolo, "--half"),
                             precision=half))
    for precision in dict.fromkeys((half, "fp32")):
        flag = ("--half",) if precision != "fp32" else ()
        for b in s.batch_sizes:
            out.append(Contender(f"pipe_b{b}_{precision}", f"pipeline batch {b} {precision}", "pipeline",
                                 (*runner, "--batch-size", str(b), *flag), b, precision))
    mid, top = s.batch_sizes[len(s.batch_sizes) // 2], s.batch_sizes[-1]
    variants = [("workers4", f"pipeline batch {mid} {half} --workers 4", mid, ("--workers", "4")),
                ("infer2", f"pipeline batch {top} {half} --infer-workers 2", top, ("--infer-workers", "2")),
                ("infer4", f"pipeline batch 1 {half} --infer-workers 4", 1, ("--infer-workers", "4")),
                ("notiming", f"pipeline batch {mid} {half} --module-timing none", mid, ("--module-timing", "none")),
                ("nosave", f"pipeline batch {top} {half} images not saved", top, ("--save-images", "none")),
                ("synthetic", f"pipeline batch {top} {half} synthetic, not saved", top,
                 ("--save-images", "none", "--source", "synthetic")),
                ("host", f"pipeline batch {top} {half} --data-path host", top, ("--data-path", "host")),
                ("device", f"pipeline batch {top} {half} --data-path device", top, ("--data-path", "device")),
                ("hostb1", f"pipeline batch 1 {half} --data-path host", 1, ("--data-path", "host"))]
    if s.device.startswith("cuda"):  # CUDA graphs exist on CUDA only (refused elsewhere)
        variants += [("graphs", f"pipeline batch 1 {half} --cuda-graphs", 1, ("--cuda-graphs",)),
                     ("graphs", f"pipeline batch {top} {half} --cuda-graphs", top, ("--cuda-graphs",))]
    for key, label, b, extra in variants:
        out.append(Contender(f"pipe_b{b}_{half}_{key}", label, "pipeline",
                             (*runner, "--batch-size", str(b), *half_flag, *extra), b, half))
    out.append(Contender("card", "the design card's command: --workers 4 (batch 1, fp32)", "pipeline",
                         (*runner, "--workers", "4"), 1, "fp32"))
    return out


def half_precision(device: str) -> str:
    """What --half runs in: fp16 on CUDA, bf16 on a CPU that computes it natively, else nothing
    (fp32: the --half contenders run without it, as a CPU without bf16 refuses it)."""
    if device.startswith("cuda"):
        return "fp16"
    from yolo.precision import has_native_bf16, read_cpu_flags
    return "bf16" if has_native_bf16(read_cpu_flags()) else "fp32"


def run_once(c: Contender) -> dict:
    """One command; its own figures. A failure is recorded, never fatal: the rest still runs."""
    scratch = tempfile.mkdtemp(prefix=f"bench-gpu-{c.key}-")
    argv = list(c.argv)
    if c.kind == "yolo":
        argv += ["--save-dir", os.path.join(scratch, "images")]
    elif c.kind == "pipeline":
        argv += ["--results", os.path.join(scratch, "results")]
    elif c.kind == "loop":
        argv += ["--out", os.path.join(scratch, "rates.json")]
    t0 = time.perf_counter()
    try:
        done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
        wall_s = time.perf_counter() - t0
        if done.returncode not in (0, 3):  # 3: some frames failed; the report says which
            return {"ok": False, "wall_s": wall_s, "exit_code": done.returncode,
                    "error": "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])}
        if c.kind == "loop":
            with open(os.path.join(scratch, "rates.json")) as f:
                return {"ok": True, "wall_s": wall_s, "rates": json.load(f)}
        if c.kind == "yolo":
            own = OWN_FPS_LINE.findall(done.stdout + done.stderr)
            return {"ok": bool(own), "wall_s": wall_s, "fps": float(own[-1][2]) if own else None,
                    "error": None if own else (done.stdout + done.stderr)[-2000:]}
        return {"ok": True, "wall_s": wall_s, **pipeline_figures(os.path.join(scratch, "results", "latest"))}
    except (subprocess.TimeoutExpired, OSError, ValueError, KeyError) as exc:
        return {"ok": False, "wall_s": time.perf_counter() - t0, "error": f"{type(exc).__name__}: {exc}"}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def pipeline_figures(run_dir: str) -> dict:
    """What this benchmark keeps of a run's report.json: fps, where the time went, the limit."""
    with open(os.path.join(run_dir, "report.json"), encoding="utf-8") as f:
        report = json.load(f)
    summary, stages = report["summary"], report["summary"]["stages"]
    return {"fps": summary["fps"], "measured_frames": summary["measured_frames"], "processed": summary["processed"],
            "failed": summary["failed"], "lost": summary["lost"], "window_s": summary["window_s"],
            "stable": summary["stable"], "latency_p50_ms": summary["latency_p50_ms"],
            "cpu_ms_per_frame": summary["cpu_ms_per_frame"], "cpu_saturation": summary["cpu_saturation"],
            "bound_fps": summary["bound_fps"], "bound_kind": summary["bound_kind"],
            "bottleneck": summary["bottleneck"], "limit": summary["limit"], "hint": summary["hint"],
            "startup_s": report["environment"].get("startup_s"), "images_saved": summary["images_saved"],
            "data_path": summary.get("data_path"),
            "cpu_ms_outside_inference": sum(st.get("cpu_ms_per_frame") or 0 for role, st in stages.items()
                                            if role != "infer"),
            "peak_pss_total_bytes": summary["peak_pss_total_bytes"],
            "stages": {role: {k: st.get(k) for k in ("workers", "ms_per_frame", "cpu_ms_per_frame", "utilisation",
                                                     "capacity_fps")} for role, st in stages.items()},
            "infer_substages_ms": {k: v.get("mean") for k, v in report["stages"]["infer"].get("substages_ms", {}).items()},
            "forward_mean_ms": report.get("forward", {}).get("mean_ms"),
            "evidence": report["bottleneck"].get("evidence")}


def gpu_info(device: str) -> dict:
    info = {"device": device}
    if device.startswith("cuda"):
        try:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                  "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
            name, driver, memory = [x.strip() for x in smi.stdout.splitlines()[0].split(",")]
            info.update(gpu=name, driver=driver, gpu_memory=memory)
        except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as exc:
            info["gpu_error"] = str(exc)
    versions = subprocess.run([sys.executable, "-c", "import torch, torchvision; print(torch.__version__, "
                               "torchvision.__version__, torch.version.cuda, torch.backends.cudnn.version())"],
                              capture_output=True, text=True, timeout=120).stdout.split()
    info.update(dict(zip(("torch", "torchvision", "cuda", "cudnn"), versions)))
    info.update(cores=len(os.sched_getaffinity(0)), cpu=cpu_model(), python=platform.python_version())
    return info


def median(values) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def bare_fps(loop_run: dict, precision: str, batch: int, tuned: bool = False) -> float | None:
    if not loop_run.get("ok"):
        return None
    rows = [r for r in loop_run["rates"]["rows"]
            if r["precision"] == precision and r["batch"] == batch and r["cudnn_benchmark"] == tuned]
    return rows[0]["forward_fps"] if rows else None


def bare_medians(runs: list[dict]) -> dict[tuple, float | None]:
    """(precision, batch, cudnn autotuning) -> the bare loop's median forward fps over rounds."""
    rows: dict[tuple, list[float]] = {}
    for run in runs:
        for row in run["rates"]["rows"] if run.get("ok") else []:
            rows.setdefault((row["precision"], row["batch"], row["cudnn_benchmark"]), []).append(row["forward_fps"])
    return {key: median(values) for key, values in rows.items()}


def ratios(cs: list[Contender], rounds: list[dict]) -> dict:
    """Medians over rounds of: each pipeline run / the bare loop at its batch and precision, the
    best pipeline / python -m yolo at the same precision, layers timing / none."""
    out = {}
    for c in cs:
        if c.kind != "pipeline":
            continue
        pairs = [r[c.key]["fps"] / bare for r in rounds if r.get(c.key, {}).get("ok")
                 and (bare := bare_fps(r.get("bare", {}), c.precision, c.batch))]
        out[f"{c.key}/bare"] = median(pairs)
    for precision in {c.precision for c in cs if c.kind == "yolo"}:
        pipes = [c.key for c in cs if c.kind == "pipeline" and c.precision == precision and "synthetic" not in c.key
                 and "nosave" not in c.key]
        yolo = f"yolo_{precision}"
        per_round = [max((r[k]["fps"] for k in pipes if r.get(k, {}).get("ok")), default=0) / r[yolo]["fps"]
                     for r in rounds if r.get(yolo, {}).get("ok") and r[yolo]["fps"]]
        out[f"best_pipeline_{precision}/yolo_{precision}"] = median(per_round)
    for c in cs:  # the device data path against the host path, same batch and precision
        if c.key.endswith("_device"):
            host = c.key.removesuffix("_device") + "_host"
            pairs = [r[c.key]["fps"] / r[host]["fps"] for r in rounds
                     if r.get(c.key, {}).get("ok") and r.get(host, {}).get("ok") and r[host]["fps"]]
            out[f"{c.key}/{host}"] = median(pairs)
    timed = [c for c in cs if c.key.endswith("_notiming")]
    for c in timed:
        base = c.key.removesuffix("_notiming")
        pairs = [r[base]["fps"] / r[c.key]["fps"] for r in rounds
                 if r.get(base, {}).get("ok") and r.get(c.key, {}).get("ok") and r[c.key]["fps"]]
        out[f"{base}(layers timing)/{c.key}"] = median(pairs)
    return out


def shown(arg: str) -> str:
    """A command's argument as the JSON keeps it: the frame set as FRAMES, other paths relative to
    the repository (no machine paths in the figures)."""
    if FRAME_SET_PREFIX in arg:
        return "FRAMES"
    return os.path.relpath(arg, REPO) if os.path.isabs(arg) else arg


def summarise(s: Settings, cs: list[Contender], rounds: list[dict], info: dict) -> dict:
    table = {}
    for c in cs:
        runs = [r[c.key] for r in rounds if c.key in r]
        entry = {"label": c.label, "command": " ".join(map(shown, c.argv[1:])), "runs": runs}
        if c.kind != "loop":
            entry["fps"] = median(r.get("fps") for r in runs if r.get("ok"))
        table[c.key] = entry
    settings = {k: v for k, v in asdict(s).items() if k != "out"}  # no machine paths in the figures
    return {"settings": settings | {"weights": os.path.basename(s.weights), "images": "fixtures"},
            "machine": info, "contenders": table, "ratios": ratios(cs, rounds),
            "method": "each tool's own fps (pipeline: report.json measured window); medians over interleaved rounds"}


def print_table(result: dict) -> None:
    m = result["machine"]
    print(f"\n{m.get('gpu', m['device'])}, driver {m.get('driver', '-')}, torch {m.get('torch')} (CUDA "
          f"{m.get('cuda')}, cuDNN {m.get('cudnn')}); {m['cores']} cores ({m['cpu']})")
    for key, c in result["contenders"].items():
        if key == "bare":
            for (precision, batch, tuned), fps in bare_medians(c["runs"]).items():
                label = f"bare loop {precision} b{batch}" + (" cudnn.bm" if tuned else "")
                print(f"  {label:48s} {fmt(fps, 1):>9s} fps")
            continue
        runs = [r for r in c["runs"] if r.get("ok")]
        extra = ""
        if runs and "bottleneck" in runs[-1]:
            last = runs[-1]
            per_stage = ", ".join(f"{role} {fmt(st['cpu_ms_per_frame'], 2)}" for role, st in last["stages"].items())
            extra = (f"  cpu {fmt(last['cpu_ms_per_frame'], 2)} ms/f ({per_stage}); bound {fmt(last['bound_fps'], 0)}"
                     f" ({last['bound_kind']}); busiest {last['bottleneck']}")
        failed = [r for r in c["runs"] if not r.get("ok")]
        note = f"  FAILED {len(failed)}x: {failed[-1].get('error', '')[-300:]}" if failed else ""
        print(f"  {c['label']:48s} {fmt(c.get('fps'), 1):>9s} fps{extra}{note}")
    print("ratios (median of per-round ratios):")
    for key, value in result["ratios"].items():
        print(f"  {key:60s} {fmt(value, 3)}")


def main(argv: list[str] | None = None) -> int:
    s = parse_args(argv)
    t_start = time.perf_counter()
    info = gpu_info(s.device)
    cs = [c for c in contenders(s, "FRAMES") if not s.only or c.key in s.only]
    if not cs:
        raise SystemExit(f"error: --only: no contender is named {', '.join(s.only)}")
    frames = make_frame_set(s.images)
    cs = [c for c in contenders(s, frames) if not s.only or c.key in s.only]
    rounds: list[dict] = []
    try:
        for r in rounds_within(s.rounds, s.budget_s, t_start):
            rounds.append({})
            for c in rotated(cs, r):
                rounds[-1][c.key] = run_once(c)
                got = rounds[-1][c.key]
                print(f"round {r + 1} {c.key}: {'ok' if got.get('ok') else 'FAILED'} {fmt(got.get('fps'), 1)} fps "
                      f"({got['wall_s']:.1f} s)", flush=True)
                if s.out:
                    with open(s.out, "w", encoding="utf-8") as f:
                        json.dump(summarise(s, cs, rounds, info), f, indent=1)
    finally:
        shutil.rmtree(frames, ignore_errors=True)
    result = summarise(s, cs, rounds, info)
    print_table(result)
    if s.out:
        with open(s.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    failed = sum(not r.get("ok") for rr in rounds for r in rr.values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
