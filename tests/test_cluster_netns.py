"""Cluster runs on Ray nodes in network namespaces of their own (tests/netns_cluster.py): each
node has its own address on a test bridge, its own hostname, PIDs, /tmp and /dev/shm; the
driver runs on the head (its namespace, its /tmp) and the source is a real S3-compatible server
(moto's server mode) that the host serves on its address on the bridge. No folder is shared: the
nodes read their frames from the store and their outputs stream back to the driver's /tmp.
Skipped where namespaces cannot be made (not root, no iproute2)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from collector.journal import JOURNAL_NAME
from inputs.feed import END
from process.faults import TEST_SLOW_ENV
from sharedmem.slots import SEGMENT_PREFIX
from tests import netns_cluster
from tests.store_server import BUCKET, fill_bucket, jpeg, s3_server
from wire.ipc_dirs import IPC_DIR_PREFIX

ray = pytest.importorskip("ray", reason="ray is not installed (pip install -r requirements-ray.txt)")
from tests.test_cluster import OURS, SMALL, assert_ledger  # noqa: E402

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
NODES = 3
IMAGES = 48
VICTIM_IMAGES = 400  # under imgs-more/: the run in which a node is killed (long enough for a late victim)
VICTIM_FRAMES = 8  # journaled on the victim before it is killed, and at least as many fed and not done
RUN_TIMEOUT_S = 180.0
CLEAN_TIMEOUT_S = 60.0
RESULTS = "/tmp/results"  # on the head, where the driver runs


@pytest.fixture(scope="module")
def netns():
    """``(cluster, store env)``: three namespaced nodes and the bucket's images on the server at
    the host's address on the bridge; everything removed after the module, whatever happened."""
    reason = netns_cluster.why_not()
    if reason:
        pytest.skip(f"Ray nodes in network namespaces cannot be made here: {reason}")
    with netns_cluster.netns_cluster() as made, pytest.MonkeyPatch.context() as patch, \
            s3_server(patch, host=netns_cluster.HOST_IP) as (_endpoint, env):
        fill_bucket({f"imgs/{i:03d}.jpg": jpeg(i) for i in range(IMAGES)})
        print(f"{NODES} namespaced nodes started in {made.start(NODES, env):.1f} s")
        yield made, env


@pytest.fixture
def clean(netns):
    """After the test: no runner, guard or stage process on a node that is still up, no pipeline
    segment in its /dev/shm, no ipc folder in its /tmp (bounded wait: runners drain first)."""
    made, _env = netns
    yield
    deadline = time.monotonic() + CLEAN_TIMEOUT_S
    while leftovers(made) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not leftovers(made)


def leftovers(made) -> list[str]:
    """Our processes, segments and ipc folders on the nodes that are up (a node's /dev/shm seen
    through its PID 1's root)."""
    found = []
    for node in made.nodes:
        if node.proc.poll() is not None:
            continue  # killed by the test: a host that lost power keeps its /tmp
        for pid in netns_cluster.namespace_pids(node.namespace):
            try:
                line = " ".join(psutil.Process(pid).cmdline())
            except psutil.Error:
                continue
            if any(mark in line for mark in OURS):
                found.append(f"{node.hostname}: {pid} {line[:100]}")
        shm = Path(f"/proc/{node.init_pid()}/root/dev/shm")  # the node's own /dev/shm
        found += [f"{node.hostname}: /dev/shm/{p.name}" for p in shm.glob(f"{SEGMENT_PREFIX}*")]
        found += [f"{node.hostname}: /tmp/{p.name}" for p in node.root.glob(f"{IPC_DIR_PREFIX}*")]
    return found


def start_driver(made, env: dict, log: Path, name: str, *flags: str) -> subprocess.Popen:
    """runner.py --ray on the head node, writing its run folder to the head's own /tmp."""
    command = [sys.executable, str(REPO / "runner.py"), "--ray", made.address, "--results", RESULTS,
               "--name", name, "--json", *SMALL, "--preset", "none", "--save-images", "all", *flags]
    with open(log, "wb") as err:
        return made.start_on(0, command, env, wd=str(REPO), stdout=subprocess.PIPE, stderr=err)


def finish(proc: subprocess.Popen, made, log: Path, name: str) -> tuple[int, dict]:
    """The driver's exit code and the merged report.json (read from the head's /tmp)."""
    try:
        out, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # nsenter and the driver it forked on the head
        proc.wait(timeout=10)
        raise AssertionError("the driver did not finish\n" + log.read_text(errors="replace")[-3000:]) from None
    assert out.strip(), log.read_text(errors="replace")[-3000:]
    report_path = run_folder(made, name) / "report.json"
    return proc.returncode, json.loads(report_path.read_text()) if report_path.is_file() else {}


def run_folder(made, name: str) -> Path:
    """The merged run folder, in the head's /tmp (seen from here)."""
    return made.nodes[0].root / RESULTS.removeprefix("/tmp/") / name


def rows_by_host(report: dict) -> dict[str, dict]:
    return {row["host"]: row for row in report["cluster"]["nodes"]}


def saved_images(folder: Path) -> list[str]:
    images = folder / "images"
    return sorted(str(p.relative_to(images)) for p in images.rglob("*") if p.is_file())


def journaled_and_fed(node) -> tuple[int, int]:
    """Frames the collector of the node's runner journaled so far, and units the driver fed it
    (both read in the node's own /tmp)."""
    done = fed = 0
    with contextlib.suppress(OSError):
        for journal in node.root.glob(f"yolo-pipeline-cluster-*/run-*/run/{JOURNAL_NAME}"):
            done += journal.read_bytes().count(b'{"f":')
        for feed in node.root.glob("yolo-pipeline-cluster-*/run-*/feed/*.jsonl"):
            fed += feed.read_bytes().replace(END, b"").count(b"\n")
    return done, fed


def test_three_namespaced_nodes_read_from_the_store_and_stream_every_frame_once(netns, clean, tmp_path):
    made, env = netns
    started = time.monotonic()
    log = tmp_path / "driver.stderr"
    code, report = finish(start_driver(made, env, log, "three", "--source", f"s3://{BUCKET}/imgs"), made, log, "three")
    assert code == 0, log.read_text(errors="replace")[-3000:]
    assert_ledger(report, IMAGES)
    frames = report["frames"]
    assert frames["processed"] == IMAGES and frames["processed_ids"] == [[0, IMAGES - 1]]
    assert frames["processed_twice"] == 0 and frames["lost"] == 0
    rows = rows_by_host(report)
    assert set(rows) == {node.hostname for node in made.nodes}, rows
    assert {row["address"] for row in rows.values()} == {node.ip for node in made.nodes}, rows
    assert all(row["processed"] > 0 and row["status"] == "ok" for row in rows.values()), rows
    folder = run_folder(made, "three")
    assert saved_images(folder) == [f"{i:03d}.jpg" for i in range(IMAGES)], "every annotated image once, by its name"
    assert not [p for p in folder.rglob(".*") if p.is_file()], "no partial copy or spill file left"
    assert not [p for node in made.nodes[1:] for p in node.root.glob("results*")], "nothing on the other nodes' /tmp"
    print(f"{IMAGES} frames in {time.monotonic() - started:.1f} s: "
          + ", ".join(f"{host} {row['processed']}" for host, row in sorted(rows.items())))


def test_a_node_killed_mid_run_loses_nothing_and_runs_nothing_twice(netns, clean, tmp_path):
    """A fourth node, slowed down, has every process in its namespace killed (SIGKILL, as a host
    that loses power) once its collector journaled a few frames: its actor is dead when the head
    sees the node dead (health checks every second here), what it had delivered counts, the rest
    runs on the other nodes."""
    made, env = netns
    fill_bucket({f"imgs-more/{i:03d}.jpg": jpeg(1000 + i) for i in range(VICTIM_IMAGES)})
    victim = made.add_node({**env, TEST_SLOW_ENV: "pre:20"})
    made.wait_for_nodes()
    log = tmp_path / "driver.stderr"
    proc = start_driver(made, env, log, "killed", "--source", f"s3://{BUCKET}/imgs-more")
    deadline = time.monotonic() + RUN_TIMEOUT_S / 2
    while True:  # until it has delivered some frames and holds more, fed and not done
        done, fed = journaled_and_fed(victim)
        if done >= VICTIM_FRAMES and fed - done >= VICTIM_FRAMES:
            break
        assert time.monotonic() < deadline and proc.poll() is None, (done, fed, log.read_text(errors="replace")[-3000:])
        time.sleep(0.1)
    time.sleep(1.0)  # the driver pulls every 0.25 s: some of what it finished has come
    assert made.kill(victim.index)
    code, report = finish(proc, made, log, "killed")
    assert code == 0, log.read_text(errors="replace")[-3000:]
    assert_ledger(report, VICTIM_IMAGES)
    frames = report["frames"]
    assert frames["processed"] == VICTIM_IMAGES and frames["processed_ids"] == [[0, VICTIM_IMAGES - 1]]
    rows = rows_by_host(report)
    assert frames["processed_twice"] == 0 and frames["lost"] == 0 and report["cluster"]["requeued"], (
        (done, fed), report["cluster"])
    dead = rows[victim.hostname]
    assert "died" in dead["status"] and dead["processed"] > 0, rows  # what it delivered before it went counts
    assert all(row["status"] == "ok" for host, row in rows.items() if host != victim.hostname), rows
    assert sum(row["processed"] for row in rows.values()) == VICTIM_IMAGES
    folder = run_folder(made, "killed")
    assert saved_images(folder) == [f"{i:03d}.jpg" for i in range(VICTIM_IMAGES)], "every annotated image once"
    print(f"{VICTIM_IMAGES} frames, " + ", ".join(f"{host} {row['processed']}" for host, row in sorted(rows.items())))
    assert not [p for p in folder.rglob(".*") if p.is_file()], "no partial copy or spill file left"
    print(f"the killed node had delivered {dead['processed']} frames; "
          f"{sum(r['frames'] for r in report['cluster']['requeued'])} ran again elsewhere")
