"""Files written whole or not at all: a failing write (ENOSPC simulated by monkeypatching fsync,
and a real 64 KiB tmpfs filled up, mounted in a private mount namespace with ``unshare``) leaves
no partial, empty or temporary file, and the run folder reports what it could not write."""

import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import analysis.atomic
from analysis.atomic import write_bytes_atomic
from analysis.report import write_run_folder
from analysis.terminal import format_summary
from tests.analysis_runs import steady_run

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def disk_full(monkeypatch):
    def refuse(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(analysis.atomic.os, "fsync", refuse)


def test_writes_and_replaces(tmp_path):
    path = tmp_path / "a.json"
    write_bytes_atomic(str(path), b"first")
    write_bytes_atomic(str(path), b"second, longer")
    assert path.read_text() == "second, longer" and os.listdir(tmp_path) == ["a.json"]


def test_a_failed_write_leaves_nothing_behind(tmp_path, monkeypatch):
    disk_full(monkeypatch)
    with pytest.raises(OSError, match="No space left"):
        write_bytes_atomic(str(tmp_path / "new.png"), b"x" * 1000)
    assert os.listdir(tmp_path) == []


def test_a_failed_rewrite_keeps_the_old_file_whole(tmp_path, monkeypatch):
    path = tmp_path / "report.md"
    path.write_text("old report")
    disk_full(monkeypatch)
    with pytest.raises(OSError):
        write_bytes_atomic(str(path), b"new report")
    assert path.read_text() == "old report" and os.listdir(tmp_path) == ["report.md"]


def test_run_folder_on_a_full_disk_reports_every_file_once(tmp_path, monkeypatch):
    disk_full(monkeypatch)
    summary = write_run_folder(str(tmp_path), steady_run())
    assert os.listdir(tmp_path) == []
    assert summary["files"]["written"] == []
    assert {"report.json", "report.md", "trace.json", "modules.csv", "detections.json", "plots.png"} <= \
        set(summary["files"]["failed"])
    assert all("No space left on device" in error for error in summary["files"]["failed"].values())
    text = format_summary(summary)  # printable without report.json
    assert "NOT WRITTEN" in text and "No space left on device" in text and "fps" in text


CHECK_FOLDER = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, {repo!r})
    from analysis.report import write_run_folder
    from tests.analysis_runs import steady_run
    folder = sys.argv[1]
    summary = write_run_folder(folder, steady_run(frames=400))
    files = {{}}
    for name in os.listdir(folder):
        with open(os.path.join(folder, name), "rb") as f:
            data = f.read()
        if name.endswith(".json"):
            json.loads(data)  # whole, or this raises
        if name.endswith(".png"):
            assert data.startswith(b"\\x89PNG") and data.rstrip().endswith(b"IEND\\xaeB`\\x82"), name
        files[name] = len(data)
    print(json.dumps({{"files": files, "summary_files": summary["files"]}}))
""")


@pytest.mark.skipif(not shutil.which("unshare"), reason="needs unshare to mount a private tmpfs")
def test_run_folder_on_a_real_full_tmpfs(tmp_path):
    folder = tmp_path / "tiny"
    folder.mkdir()
    script = tmp_path / "check.py"
    script.write_text(CHECK_FOLDER.format(repo=REPO))
    command = f"mount -t tmpfs -o size=64k none {folder} && {sys.executable} {script} {folder}"
    done = subprocess.run(["unshare", "-rm", "sh", "-c", command], capture_output=True, text=True, timeout=120)
    if done.returncode != 0 and "mount" in done.stderr and "Traceback" not in done.stderr:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    files, reported = result["files"], result["summary_files"]
    assert reported["failed"], "64 KiB should not hold every report"
    assert all(size > 0 for size in files.values())  # no empty file
    assert not [name for name in files if name.endswith(".partial")]
    assert set(files) == set(reported["written"])  # every file on disk was reported written, whole
    assert "report.json" in files and "report.md" in files  # the most useful files go first


def test_new_files_get_the_usual_permissions(tmp_path):
    umask = os.umask(0o022)
    try:
        write_bytes_atomic(str(tmp_path / "report.md"), b"text")
    finally:
        os.umask(umask)
    assert (tmp_path / "report.md").stat().st_mode & 0o777 == 0o644
