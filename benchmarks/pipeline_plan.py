"""bench_pipeline.py's plan: its settings from the command line, the contenders (each a whole
command) and the ratios it reports, with the goals the issues quote them against."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

from analysis.machine import usable_cores

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(os.path.dirname(REPO), "shared", "fixtures")
PHOTO_SUFFIXES = (".jpg", ".jpeg", ".png")
DEFAULTS = {"frames": 144, "rounds": 5, "span_s": 10.0}
QUICK = {"frames": 8, "rounds": 1, "span_s": 1.5}
MATRIX = "both"  # --backend both: python -m yolo and the pipeline on each backend, fp32 and --half


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
    p.add_argument("--backend", choices=("torch", "openvino", MATRIX), default="torch",
                   help=f"the backend of the pipeline and python -m yolo contenders; {MATRIX}: both of them on torch "
                        "and on openvino, fp32 and --half, with the issue's goals; with openvino, python -m yolo "
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
    if s.backend == MATRIX:
        return matrix_contenders(yolo, pipeline, half)
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


def matrix_contenders(yolo: tuple, pipeline: tuple, half: str) -> list[Contender]:
    """python -m yolo and the pipeline, each on torch and on OpenVINO, fp32 and --half: the
    matrix the backend goals (GOALS) are quoted from."""
    matrix = []
    for kind, argv, name in (("yolo", yolo, "python -m yolo"), ("pipeline", pipeline, "pipeline")):
        for backend in ("torch", "openvino"):
            flag = ("--backend", backend)
            matrix += [Contender(f"{kind}_{backend}_fp32", f"{name} {backend} fp32", kind, (*argv, *flag)),
                       Contender(f"{kind}_{backend}_half", f"{name} {backend} --half ({half})", kind,
                                 (*argv, *flag, "--half"), half=True)]
    return matrix


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

MATRIX_RATIOS = (  # as RATIOS, for --backend both
    ("pipeline_openvino_fp32/yolo_torch_fp32", "pipeline_openvino_fp32", "yolo_torch_fp32", None),
    ("pipeline_openvino_half/yolo_torch_fp32", "pipeline_openvino_half", "yolo_torch_fp32", None),
    ("pipeline_openvino_fp32/yolo_openvino_fp32", "pipeline_openvino_fp32", "yolo_openvino_fp32", None),
    ("pipeline_openvino_half/yolo_openvino_half", "pipeline_openvino_half", "yolo_openvino_half", None),
    ("pipeline_torch_fp32/yolo_torch_fp32", "pipeline_torch_fp32", "yolo_torch_fp32", None),
    ("pipeline_torch_half/yolo_torch_half", "pipeline_torch_half", "yolo_torch_half", None),
    ("pipeline_openvino_fp32/pipeline_torch_fp32", "pipeline_openvino_fp32", "pipeline_torch_fp32", None),
)
GOALS = {  # the least each ratio should reach (issue 19): OpenVINO's pipeline against the sequential detector
    "pipeline_openvino_fp32/yolo_torch_fp32": 1.5,
    "pipeline_openvino_fp32/yolo_openvino_fp32": 1.1,
    "pipeline_openvino_half/yolo_openvino_half": 1.1,
}
EFFICIENCY_GOAL = 0.95  # the pipeline's fps / the bound its own report computes
