"""End-to-end runs of runner.py: the run folder, the frame ledger, and detections equal to
the single-process detector's."""

import json
import os
import shutil
import subprocess
import sys

import pytest

import runner
from yolo.precision import has_native_bf16, read_cpu_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_pipeline(tmp_path, *flags):
    results = tmp_path / "results"
    code = runner.main(["--results", str(results), "--no-progress", "--log-level", "warning", *flags])
    return code, results / "latest"


def load(run_dir, name):
    with open(run_dir / name) as f:
        return json.load(f)


def test_synthetic_run_folder_is_complete_and_consistent(tmp_path):
    code, run_dir = run_pipeline(tmp_path, "--device", "cpu", "--frames", "10", "--warmup", "2", "--workers", "1",
                                 "--infer-workers", "1", "--synthetic-count", "6", "--save-images", "3")
    assert code == 0
    for name in ("report.json", "report.md", "modules.csv", "trace.json", "detections.json", "run.log", "plots.png"):
        assert (run_dir / name).is_file(), name
    report = load(run_dir, "report.json")
    frames = report["frames"]
    assert frames["in"] == 10 and frames["processed"] + frames["failed"] == frames["in"] and frames["accounted"]
    for role in ("pre", "infer", "post"):
        assert report["stages"][role]["frames"] == frames["processed"]
    lat = report["latency_ms"]
    assert 0 < lat["p50"] <= lat["p90"] <= lat["p95"] <= lat["p99"] <= lat["max"]
    # warm-up frames (2) and each inference process's first forward of a shape are not measured
    assert report["throughput"]["fps"] > 0 and 0 < report["throughput"]["measured_frames"] <= 8
    outermost = [m["share"] for m in report["modules"] if m["outermost"] and m["share"] is not None]
    assert sum(outermost) == pytest.approx(1.0, abs=1e-6)
    assert [m["name"] for m in report["modules"]][:3] == ["model.0", "model.1", "model.2"]
    # images saved (every 3rd) and still under 4 KB a frame on every link: pixels go by reference
    assert all(0 < link["bytes_per_frame"] < 4096 for link in report["links"].values()), report["links"]
    assert set(report["links"]) == {"pre->infer", "infer->post", "post->collector"}
    assert {w["precision"] for w in report["stages"]["infer"]["per_worker"]} == {"fp32"}
    trace = load(run_dir, "trace.json")
    tracks = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert {"pre-0", "infer-0", "post-0", "collector"} <= tracks
    assert any(e.get("tid", 0) >= 10 for e in trace["traceEvents"] if e["ph"] == "X")  # module spans
    with open(run_dir / "modules.csv") as f:
        lines = f.read().splitlines()
    assert lines[0].startswith("name,type,params,input_shape,calls") and len(lines) == len(report["modules"]) + 1
    saved = sorted(os.listdir(run_dir / "images" / "synthetic"))
    assert len(saved) == 4  # frames 0, 3, 6, 9; the second pass carries its pass number
    assert report["environment"]["threads_per_process"]["infer-0"]["torch"] == 1


def test_unreadable_frame_is_failed_with_a_reason(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(os.path.join(REPO, "tests", "__init__.py"), src / "broken.jpg")  # not an image
    import cv2
    import numpy as np
    cv2.imwrite(str(src / "ok.png"), np.full((64, 96, 3), 127, np.uint8))
    code, run_dir = run_pipeline(tmp_path, "--source", str(src), "--workers", "1", "--infer-workers", "1")
    assert code == 3  # finished, but a frame failed
    report = load(run_dir, "report.json")
    assert report["frames"]["in"] == 2 and report["frames"]["processed"] == 1 and report["frames"]["failed"] == 1
    failure = report["frames"]["failures"][0]
    assert failure["name"] == "broken.jpg" and "cannot decode" in failure["reason"] and failure["stage"] == "pre"


@pytest.mark.parametrize("flags", [["--unknown-flag"], ["--imgsz", "100"], ["--device", "tpu"],
                                   ["--save-images", "sometimes"], ["--source", "/no/such/dir"]])
def test_bad_input_exits_2(tmp_path, flags):
    with pytest.raises(SystemExit) as exc:  # argparse's own exit for unknown flags
        code, _ = run_pipeline(tmp_path, *flags)
        raise SystemExit(code)
    assert exc.value.code == 2


def test_unknown_config_key_is_named(tmp_path, caplog):
    bad = tmp_path / "bad.toml"
    bad.write_text("[pipeline]\nworkerz = 3\n")
    code = runner.main(["--config", str(bad), "--no-progress"])
    assert code == 2 and "workerz" in caplog.text, caplog.text


def test_a_bad_value_is_named_as_the_user_gave_it(tmp_path, caplog):
    from_file = tmp_path / "imgsz.toml"
    from_file.write_text("[detect]\nimgsz = 33\n")
    assert runner.main(["--config", str(from_file), "--no-progress"]) == 2
    assert "error: config imgsz: expected a positive multiple of 32, got 33" in caplog.text, caplog.text
    caplog.clear()
    assert runner.main(["--imgsz", "33", "--no-progress"]) == 2
    assert "error: --imgsz: expected a positive multiple of 32, got 33" in caplog.text, caplog.text


@pytest.mark.skipif(has_native_bf16(read_cpu_flags()), reason="this CPU has native bf16: --half is valid")
def test_half_on_a_cpu_without_bf16_exits_2_naming_what_is_missing(tmp_path, caplog):
    assert runner.main(["--half", "--device", "cpu", "--results", str(tmp_path), "--no-progress"]) == 2
    assert "--half: half precision on the CPU means bfloat16" in caplog.text and "avx512_bf16" in caplog.text
    assert list(tmp_path.iterdir()) == []  # refused before any run folder


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_is_a_clear_error(tmp_path):
    out = subprocess.run([sys.executable, "runner.py", "--device", "cuda", "--results", str(tmp_path)],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "CUDA is not available" in out.stderr and "cpu" in out.stderr


def sequential_detections(weights, sources, rect, tmp_path):
    out = tmp_path / f"seq-{rect}.json"
    cmd = [sys.executable, "-m", "yolo", "--weights", str(weights), "--source",
           str(sources), "--save-json", str(out), "--quiet", "--threads", "1", "--rect" if rect else "--square"]
    subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, timeout=300)
    return json.loads(out.read_text())


def assert_same_detections(pipeline, sequential):
    key = lambda d: (d["image"], d["class_id"], round(d["box"][0]), round(d["box"][1]))
    pipeline, sequential = sorted(pipeline, key=key), sorted(sequential, key=key)
    assert len(pipeline) == len(sequential) > 0
    for p, s in zip(pipeline, sequential):
        assert (p["image"], p["class_id"], p["class"]) == (s["image"], s["class_id"], s["class"])
        assert p["score"] == pytest.approx(s["score"], abs=1e-4)
        assert p["box"] == pytest.approx(s["box"], abs=1e-3)


@pytest.mark.parametrize("rect", [True, False], ids=["rect", "square"])
@pytest.mark.parametrize("workers", [("1", "1", "1"), ("2", "2", "2")], ids=["1-1-1-b1", "2-2-2-b2"])
def test_pipeline_detections_equal_the_sequential_detector(fixtures_dir, tmp_path, rect, workers):
    pre, infer, post = workers
    batch = "1" if infer == "1" else "2"
    sources = tmp_path / "imgs"
    sources.mkdir()
    for name in ("bus.jpg", "zidane.jpg"):
        shutil.copy(fixtures_dir / name, sources / name)
    code, run_dir = run_pipeline(
        tmp_path, "--weights", str(fixtures_dir / "yolov5n.pt"), "--source", str(sources),
        "--rect" if rect else "--square", "--pre-workers", pre, "--infer-workers", infer, "--post-workers", post,
        "--batch-size", batch, "--save-images", "none")
    assert code == 0
    assert load(run_dir, "report.json")["frames"]["accounted"]
    assert_same_detections(load(run_dir, "detections.json"), sequential_detections(fixtures_dir / "yolov5n.pt", sources, rect, tmp_path))


def test_a_frame_larger_than_a_slot_travels_in_its_message(tmp_path):
    """Slots hold originals up to 4K (prepare.MAX_SLOT_ORIGINAL_PIXELS); a larger frame goes as
    bytes in its message instead: processed and saved whole, not a crash or a cut image."""
    import cv2
    import numpy as np
    src = tmp_path / "src"
    src.mkdir()
    big = np.zeros((3000, 4200, 3), np.uint8)
    big[::50] = 200  # stripes: a cut or shifted copy would not match
    cv2.imwrite(str(src / "big.png"), big)
    cv2.imwrite(str(src / "small.png"), np.full((48, 64, 3), 90, np.uint8))
    code, run_dir = run_pipeline(tmp_path, "--source", str(src), "--workers", "1", "--infer-workers", "1",
                                 "--imgsz", "64")
    assert code == 0
    report = load(run_dir, "report.json")
    assert report["frames"]["processed"] == 2
    saved = cv2.imread(str(run_dir / "images" / "big.png"))
    assert saved.shape == big.shape and np.array_equal(saved[::50, :, 0][:, 100], big[::50, :, 0][:, 100])
    assert report["links"]["pre->infer"]["bytes_per_frame"] > big.nbytes / 2  # the big one went inline
