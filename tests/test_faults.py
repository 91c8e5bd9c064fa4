"""Faults and bad input on live runs, each with its outcome: the exit code, the report's fields,
the processes, the files left, and /dev/shm and the temporary folder empty afterwards.

Workers killed, stopped or restarted too often are test_restarts.py. Already covered elsewhere
and not repeated here: an undecodable image is a failed frame with
exit 3 (test_pipeline), unknown flags and bad --imgsz/--device/--source values exit 2
(test_pipeline), CUDA where there is none (test_pipeline), the pixel limit read from a header
(test_imageio), CURVE refusing a socket without the run's key (test_transport)."""

from __future__ import annotations

import json
import shlex
import socket
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import cv2
import numpy as np
import pytest
import zmq

from tests.live_run import REPO, SMALL_RUN, frame_counts
from process.faults import TEST_SLOW_ENV

pytestmark = pytest.mark.slow


def _can_unshare() -> bool:
    try:
        return subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=1m none /mnt"],
                              capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


needs_unshare = pytest.mark.skipif(not _can_unshare(), reason="needs unshare -rm and tmpfs mounts")


# -- a full disk ------------------------------------------------------------------------------------

@needs_unshare
def test_a_full_disk_stops_image_saving_once_and_keeps_the_report(live, tmp_path):
    """The results folder is a 2 MB tmpfs: images fill it, saving stops with one error, every
    frame is still detected and counted, the report files are written whole, exit code 4."""
    disk, copied = tmp_path / "disk", tmp_path / "copied"
    disk.mkdir()
    script = (f"mount -t tmpfs -o size=2m none {disk} && {{runner}}; code=$?; "
              f"cp -a {disk}/results {copied}; exit $code")
    run = live(*SMALL_RUN, "--preset", "none", "--frames", "24", "--save-txt", shell=["unshare", "-rm", "sh", "-c"],
               script=script, results=disk / "results")
    run.wait_for_stage("pre-0")
    runner_pid = run.runner_pid  # seen while it runs: the shell around it leads the session
    code = run.wait()
    assert code == 4, run.stderr()
    run.results, run._runner_pid = copied, runner_pid  # the tmpfs went with its namespace: read the copy
    errors = [line for line in run.stderr().splitlines() if "No space left on device writing" in line]
    assert len(errors) == 1 and "image and label saving stopped, detections go on" in errors[0], run.stderr()
    assert "24 frames in, 24 processed, 0 failed" in run.stdout()  # the summary still prints
    report = run.report()  # whole: it parses
    assert frame_counts(report) == (24, 24, 0, 0) and report["frames"]["accounted"]
    assert "No space left on device" in report["outputs"]["image_error"]
    assert json.loads((run.run_dir / "detections.json").read_text()) == []  # preset none: kept, and empty
    assert json.loads((run.run_dir / "predictions.json").read_text()) == []
    assert not list(run.run_dir.rglob("*.tmp*")), "a temporary file of an atomic write was left"
    images = [p for p in (run.run_dir / "images").rglob("*") if p.is_file()]
    assert 0 < len(images) < 24
    assert all(cv2.imread(str(p)) is not None for p in images), "a truncated image was left"
    run.assert_clean()


@needs_unshare
def test_a_small_dev_shm_sends_the_frames_in_messages_instead(live, tmp_path):
    """/dev/shm a 16 MB tmpfs (Docker gives 64 MB): the frame slots do not fit, so the run says
    so once and carries the pixels in its messages; every frame is processed, no SIGBUS."""
    shm_copy = tmp_path / "shm-after"
    script = (f"mount -t tmpfs -o size=16m none /dev/shm && {{runner}}; code=$?; "
              f"ls -A /dev/shm > {shm_copy}; exit $code")
    run = live(*SMALL_RUN, "--preset", "none", "--frames", "24", shell=["unshare", "-rm", "sh", "-c"], script=script)
    assert run.wait() == 0, run.stderr()
    warnings = [line for line in run.stderr().splitlines() if "frames travel in the messages instead" in line]
    assert len(warnings) == 1 and "/dev/shm has" in warnings[0], run.stderr()
    report = run.report()
    assert frame_counts(report) == (24, 24, 0, 0)
    assert report["links"]["pre->infer"]["bytes_per_frame"] > 64 * 64 * 3, "the pixels went in the messages"
    assert shm_copy.read_text() == "", "nothing left in the run's /dev/shm"
    run.assert_clean()


@needs_unshare
def test_a_ring_larger_than_the_free_shared_memory_is_refused_not_a_sigbus(tmp_path):
    """The ring's file is allocated whole when made: a tmpfs too small gives ENOSPC at once (and no
    file), where a sparse file would kill its writer with SIGBUS later."""
    folder = tmp_path / "shm"
    folder.mkdir()
    probe = ("import errno, os; from sharedmem.slots import SlotRing\n"
             f"try:\n    SlotRing('ring', 1 << 20, 8, directory={str(folder)!r})\n"
             "except OSError as exc:\n    print('refused', errno.errorcode[exc.errno], os.listdir("
             f"{str(folder)!r}))\n")
    out = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=2m none {folder} && "
                          f"{shlex.quote(sys.executable)} -c {shlex.quote(probe)}"],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "refused ENOSPC []", (out.stdout, out.stderr)


# -- tcp: CURVE keys per run -------------------------------------------------------------------------

def _free_port_run(count: int) -> int:
    """A base port with ``count`` free consecutive ports after it."""
    for base in range(36000, 60000, 97):
        try:
            held = []
            for port in range(base, base + count):
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    pytest.skip("no run of free tcp ports")


def test_a_tcp_port_in_use_exits_2_before_any_process_starts(live):
    """A worker's port (infer-0's, the third) held by another program: found by the runner before
    it starts anything, named, exit 2, and no run folder."""
    base = _free_port_run(7)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", base + 2))
        squatter.listen()
        run = live(*SMALL_RUN, "--preset", "none", "--frames", "8", "--transport", "tcp", "--tcp-base-port", str(base))
        assert run.wait(60) == 2, run.stderr()
    assert f"--tcp-base-port: port {base + 2} on 127.0.0.1 is not free" in run.stderr(), run.stderr()
    assert "Traceback" not in run.stderr() and not run.run_dir.exists()
    run.assert_clean()


def test_tcp_strangers_cannot_connect_nor_take_frames(live):
    """On tcp every bound socket is a CURVE server with keys made for this run: a stranger, with
    or without CURVE, sends into none of them and takes no frame, and the run ends whole."""
    ports = 7  # pre-0, pre-0-returns, infer-0, collector, control, progress, health
    base = _free_port_run(ports)
    run = live(*SMALL_RUN, "--preset", "none", "--frames", "30", "--transport", "tcp", "--tcp-base-port", str(base),
               "--save-images", "1", env={TEST_SLOW_ENV: "post:40"})
    run.wait_for_images(2)
    ctx = zmq.Context()
    strangers = []
    try:
        stranger_keys = zmq.curve_keypair()
        for port in range(base, base + ports):
            for curve in (False, True):
                kind = zmq.SUB if port == base + 4 else zmq.DEALER
                s = ctx.socket(kind)
                s.setsockopt(zmq.LINGER, 0)
                s.setsockopt(zmq.IDENTITY, b"infer-0.9")  # would take infer-0's frames if it got in
                if kind == zmq.SUB:
                    s.setsockopt(zmq.SUBSCRIBE, b"")
                if curve:
                    s.curve_publickey, s.curve_secretkey = stranger_keys
                    s.curve_serverkey = zmq.curve_keypair()[0]  # not the run's server key
                s.connect(f"tcp://127.0.0.1:{port}")
                strangers.append(s)
        for s in strangers:
            if s.type == zmq.DEALER:
                try:
                    s.send_multipart([b"\0" * 16, b"\x82\xa4type\xa6credit\xa1n\x64"], flags=zmq.NOBLOCK)
                except zmq.Again:
                    pass  # no connection was ever made: nothing to queue on
        poller = zmq.Poller()
        for s in strangers:
            poller.register(s, zmq.POLLIN)
        received = dict(poller.poll(1500))
        assert not received, "a stranger received a message from the run"
    finally:
        for s in strangers:
            s.close()
        ctx.term()
    assert run.wait() == 0, run.stderr()
    report = run.report()
    assert frame_counts(report) == (30, 30, 0, 0)
    assert not report["dropped_messages"], "a stranger's message got through CURVE to be dropped later"
    run.assert_clean()


# -- bad input in a source folder -------------------------------------------------------------------

def write_huge_png(path: Path, side: int) -> None:
    """A valid 1-bit grey PNG of side x side pixels (400 MP for 20000): a few hundred KB on
    disk, gigabytes once decoded, made without ever holding it in memory."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    row = b"\0" * (1 + (side + 7) // 8)  # filter byte + packed bits
    packer = zlib.compressobj(9)
    body = b"".join(packer.compress(row) for _ in range(side)) + packer.flush()
    ihdr = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", body) + chunk(b"IEND", b""))


def write_clip(path: Path, frames: int) -> None:
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 10.0, (96, 64))
    for i in range(frames):
        writer.write(np.full((64, 96, 3), 20 * i, np.uint8))
    writer.release()


def test_a_folder_of_bad_entries_gives_failed_frames_with_reasons(live, tmp_path):
    """A huge-pixel image, one over --max-pixels and a broken symlink are failed frames with
    their reasons, never a memory blow-up; a file that is not an image or video is left out and
    counted; a video in the folder is read as a video; --allow-failures makes the exit code 0."""
    src = tmp_path / "src"
    src.mkdir()
    cv2.imwrite(str(src / "ok.png"), np.full((64, 96, 3), 120, np.uint8))
    write_huge_png(src / "huge.png", 20000)
    cv2.imwrite(str(src / "mid.png"), np.zeros((1000, 1200, 3), np.uint8))  # 1.2 MP: over --max-pixels
    (src / "gone.jpg").symlink_to(src / "nowhere.jpg")
    (src / "notes.txt").write_text("not an image\n")
    write_clip(src / "clip.mp4", 6)
    run = live(*SMALL_RUN, "--preset", "none", "--source", str(src), "--max-pixels", "1000000", "--allow-failures")
    assert run.wait() == 0, run.stderr()
    report = run.report()
    frames_in, processed, failed, cancelled = frame_counts(report)
    assert (frames_in, processed, failed, cancelled) == (10, 7, 3, 0)  # ok.png + 6 video frames; 3 failed
    reasons = {f["name"]: f["reason"] for f in report["frames"]["failures"]}
    assert set(reasons) == {"huge.png", "mid.png", "gone.jpg"} and report["sources"]["skipped_files"] == 1
    assert "max_pixels 1000000" in reasons["huge.png"] and "400.0" in reasons["huge.png"], reasons
    assert "max_pixels 1000000" in reasons["mid.png"]
    assert "broken symlink" in reasons["gone.jpg"], reasons
    assert all(f["stage"] == "pre" and f["worker"] == "pre-0" for f in report["frames"]["failures"])
    assert report["sources"]["videos"][0]["frames"] == 6
    peak = report["resources"]["processes"]["pre-0"]["peak_rss_bytes"]
    assert peak < 400 << 20, f"preprocess peaked at {peak >> 20} MiB"  # decoded, huge.png alone is 400 MB
    run.assert_clean()


# -- bad usage: exit 2 at the edge, nothing left ---------------------------------------------------

def _usage_cases(tmp_path: Path) -> dict:
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "empty").mkdir()
    (tmp_path / "not-weights.pt").write_text("not a checkpoint")
    (tmp_path / "binary.toml").write_bytes(bytes(range(256)))
    return {
        "results-is-a-file": (["--results", str(tmp_path / "a-file")], "expected a folder, got a file"),
        "results-parent-is-a-file": (["--results", str(tmp_path / "a-file" / "results")], "cannot write run folders"),
        "preset-foo": (["--preset", "foo"], "--preset: expected one of"),
        "weights-missing": (["--weights", str(tmp_path / "missing.pt")], "no such file"),
        "weights-not-a-checkpoint": (["--weights", str(tmp_path / "not-weights.pt")], "--weights:"),
        "source-empty-folder": (["--source", str(tmp_path / "empty")], "--source:"),
        "device-list-of-cpus": (["--device", "cpu,cpu"], "--device:"),
        "classes-the-model-lacks": (["--classes", "0", "999"], "--classes: expected class ids 0..79 (the model has 80"),
        "binary-config": (["--config", str(tmp_path / "binary.toml")], f"config file {tmp_path / 'binary.toml'}: not valid"),
    }


@pytest.mark.parametrize("case", ["results-is-a-file", "results-parent-is-a-file", "preset-foo", "weights-missing",
                                  "weights-not-a-checkpoint", "source-empty-folder", "device-list-of-cpus",
                                  "classes-the-model-lacks", "binary-config"])
def test_bad_usage_exits_2_naming_it_before_the_run(live, tmp_path, case):
    flags, message = _usage_cases(tmp_path)[case]
    results = tmp_path / "results"
    run = live("--no-progress", *flags)  # a --results here comes after the helper's, and wins
    assert run.wait(60) == 2
    assert message in run.stderr() and "Traceback" not in run.stderr(), run.stderr()
    assert not (results / "run").exists()  # no run folder was made
    run.assert_clean()


@needs_unshare
def test_a_read_only_results_folder_exits_2_before_the_run(live, tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    run = live("--no-progress", shell=["unshare", "-rm", "sh", "-c"],
               script=f"mount -t tmpfs -o ro,size=1m none {folder} && {{runner}}", results=folder)
    assert run.wait(60) == 2
    assert f"cannot write run folders in '{folder}' (read-only file system)" in run.stderr(), run.stderr()
    run.assert_clean()
