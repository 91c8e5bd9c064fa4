"""Cluster runs (runner.py --ray) on ray.cluster_utils.Cluster: simulated nodes on this machine,
one module-scoped cluster: a head without CPUs, a fast node, and a slow one whose inference burns
60 CPU-ms a frame (process.faults, through the environment its processes inherit): one inference
process a node, so the slow node stays under 17 fps however many cores the machine has (a slowed
preprocessing let two readers outrun it on a bigger machine, and the test saw 1.09x). Each
test checks that nothing of ours is left: no runner, guard or stage process, no /dev/shm
segment, no ipc folder (the nodes' TMPDIR is a private folder)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from process.faults import TEST_SLOW_ENV
from wire.ipc_dirs import IPC_DIR_PREFIX
from sharedmem.slots import SEGMENT_PREFIX, SHM_DIR

ray = pytest.importorskip("ray", reason="ray is not installed (pip install -r requirements-ray.txt)")
from ray.cluster_utils import Cluster  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SMALL = ("--imgsz", "64", "--workers", "1", "--no-progress", "--save-images", "none")
RUN_TIMEOUT_S = 300.0
OURS = ("runner.py", "cluster.guard", "cluster.janitor", "yolo-pipeline")
NODE_ENV = "YOLO_PIPELINE_TEST_NODE"  # which simulated node a process belongs to


@pytest.fixture(scope="module")
def cluster():
    tmpdir = tempfile.mkdtemp(prefix="rc-", dir="/tmp")
    made = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    made.tmpdir = tmpdir
    made.labels = {add_node(made, "fast", num_cpus=2).node_id: "fast",
                   add_node(made, "slow", num_cpus=1, slow="infer:60").node_id: "slow"}
    yield made
    made.shutdown()
    subprocess.run(["rm", "-rf", tmpdir], check=False)


def add_node(cluster, label: str, num_cpus: int, slow: str = ""):
    """A node whose processes inherit TMPDIR (private), a label, and a slowdown."""
    env = {"TMPDIR": cluster.tmpdir, NODE_ENV: label, TEST_SLOW_ENV: slow}
    before = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        node = cluster.add_node(num_cpus=num_cpus)
    finally:
        for key, value in before.items():
            os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)
    cluster.wait_for_nodes()
    return node


def node_processes(tmpdir: str, label: str, mark: str) -> list[int]:
    """Pids of our processes of the node ``label`` whose command line holds ``mark``."""
    found = []
    for process in psutil.process_iter(["pid"]):
        try:
            env = process.environ()
            if env.get("TMPDIR") == tmpdir and env.get(NODE_ENV) == label and mark in " ".join(process.cmdline()):
                found.append(process.pid)
        except (psutil.Error, OSError):
            continue
    return found


def our_processes(tmpdir: str) -> list[str]:
    """Runner, guard and stage processes started under the cluster's private TMPDIR."""
    found = []
    for process in psutil.process_iter(["pid"]):
        try:
            if process.environ().get("TMPDIR") != tmpdir or process.status() == psutil.STATUS_ZOMBIE:
                continue
            line = " ".join(process.cmdline())
            if any(mark in line for mark in OURS):
                found.append(f"{process.pid} {line[:100]}")
        except (psutil.Error, OSError):
            continue
    return found


def our_segments(before: set[str], tmpdir: str) -> list[str]:
    """Segments made during the test by a runner that is gone or is ours (other sessions' live
    runs on this machine are not ours)."""
    left = []
    for name in set(os.listdir(SHM_DIR)) - before:
        if not name.startswith(SEGMENT_PREFIX):
            continue
        pid = int(name[len(SEGMENT_PREFIX):].split("-")[0])
        try:
            mine = psutil.Process(pid).environ().get("TMPDIR") == tmpdir
        except (psutil.Error, OSError):
            mine = True  # its runner is gone: a leak, whoever made it
        if mine:
            left.append(name)
    return left


@pytest.fixture
def clean(cluster):
    """After the test: none of our processes, segments or ipc folders (bounded wait: a runner
    told SIGTERM by its guard drains first)."""
    before = set(os.listdir(SHM_DIR))
    work_dirs = set(os.listdir(cluster.tmpdir))  # live actors' folders: removed when the cluster ends
    yield
    deadline = time.monotonic() + 60
    while (our_processes(cluster.tmpdir) or our_segments(before, cluster.tmpdir)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not our_processes(cluster.tmpdir), our_processes(cluster.tmpdir)
    assert not our_segments(before, cluster.tmpdir), our_segments(before, cluster.tmpdir)
    left = list(Path(cluster.tmpdir).glob(f"{IPC_DIR_PREFIX}*"))
    assert not left, f"ipc folders left: {left}"
    orphans = [p for p in Path(cluster.tmpdir).glob("yolo-pipeline-cluster-*") if p.name not in work_dirs]
    assert not orphans, f"a dead actor's folder left: {orphans}"


def start_driver(cluster, results: Path, *flags: str, env: dict | None = None) -> subprocess.Popen:
    """runner.py --ray as a terminal starts a job: its own session, Ctrl-C at its default."""
    err = open(results.parent / "driver.stderr", "wb")
    command = [sys.executable, str(REPO / "runner.py"), "--ray", cluster.address, "--results", str(results),
               "--name", "run", "--json", *SMALL, *flags]
    if "--weights" not in flags:
        command += ["--preset", "none"]
    return subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=err, env={**os.environ, **(env or {})},
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def finish(proc: subprocess.Popen, results: Path) -> tuple[int, dict, dict]:
    try:
        out, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError("the driver did not finish\n" + driver_log(results)[-3000:]) from None
    assert out.strip(), driver_log(results)[-3000:]
    report_path = results / "run" / "report.json"
    report = json.loads(report_path.read_text()) if report_path.is_file() else {}
    return proc.returncode, json.loads(out), report


def driver_log(results: Path) -> str:
    return (results.parent / "driver.stderr").read_text(errors="replace")


def frames_by_node(report: dict) -> dict[str, int]:
    return {row["node"]: row["processed"] for row in report["cluster"]["nodes"]}


def assert_ledger(report: dict, frames_in: int) -> None:
    f = report["frames"]
    assert f["in"] == frames_in and f["accounted"], f
    assert f["in"] == f["processed"] + f["failed"] + f["lost"] + f["cancelled"], f


def test_nodes_share_the_work_by_speed_and_the_outputs_merge_under_global_ids(cluster, clean, tmp_path):
    """The fast node does most of the frames, in proportion to its speed; both runners' windows
    end close together (the slow node holds at most its lead); one run folder holds every frame
    once under its global id and name (two readers a node: local ids k * 2 + w mapped back), a
    trace group per node, the cluster bound as the sum."""
    results = tmp_path / "results"
    proc = start_driver(cluster, results, "--synthetic-count", "400", "--save-images", "all", "--pre-workers", "2")
    code, summary, report = finish(proc, results)
    assert code == 0, driver_log(results)[-3000:]
    assert_ledger(report, 400)
    assert report["frames"]["processed_ids"] == [[0, 399]] and report["frames"]["processed_twice"] == 0
    nodes = label_rows(cluster, report)
    fast, slow = nodes["fast"], nodes["slow"]
    assert fast["processed"] + slow["processed"] == 400 and slow["processed"] > 0, nodes
    speed = fast["fps"] / slow["fps"]
    share = fast["processed"] / slow["processed"]
    print(f"fast {fast['processed']} frames at {fast['fps']:.1f} fps, slow {slow['processed']} at {slow['fps']:.1f} "
          f"fps: {share:.2f}x the frames at {speed:.2f}x the speed; windows end {fast['window_end_unix']:.2f} and "
          f"{slow['window_end_unix']:.2f}")
    assert speed > 1.5, nodes  # the slowdown took: otherwise this test shows nothing
    assert speed / 2 < share < speed * 2, (share, speed, nodes)
    ends = {label: row["window_end_unix"] for label, row in nodes.items()}
    slow_lead_s = 3 + (7 + 2 * slow["fps"]) / slow["fps"]  # its pipeline's depth and lead, and a poll
    assert abs(ends["fast"] - ends["slow"]) < slow_lead_s, (ends, nodes)
    images = sorted(p.name for p in (results / "run" / "images" / "synthetic").iterdir())
    assert images == [f"{i:05d}.jpg" for i in range(400)]
    assert report["throughput"]["fps"] and report["latency_ms"]["count"] > 0
    assert report["bottleneck"]["bound_fps"] == pytest.approx(sum(r["bound_fps"] for r in nodes.values()))
    trace = json.loads((results / "run" / "trace.json").read_text())
    assert {e["pid"] for e in trace["traceEvents"]} == {1, 2}
    assert os.readlink(results / "latest") == "run"


def label_rows(cluster, report: dict) -> dict[str, dict]:
    """The report's node rows by the label of the simulated node each ran on."""
    return {cluster.labels.get(row["node_id"], row["node"]): row for row in report["cluster"]["nodes"]}


def test_a_node_removed_mid_run_loses_no_frame(cluster, clean, tmp_path):
    """A third node is removed while its runner works: every unit fed to it runs again on the
    others; every frame is processed once (the merged ledger's global ids), none lost."""
    victim = add_node(cluster, "victim", num_cpus=1, slow="pre:10")
    results = tmp_path / "results"
    proc = start_driver(cluster, results, "--synthetic-count", "600")
    deadline = time.monotonic() + RUN_TIMEOUT_S / 2
    while not node_processes(cluster.tmpdir, "victim", "yolo-pipeline post"):
        assert time.monotonic() < deadline and proc.poll() is None, driver_log(results)[-3000:]
        time.sleep(0.2)
    time.sleep(1)  # its pipeline is working
    cluster.remove_node(victim)
    code, summary, report = finish(proc, results)
    assert code == 0, driver_log(results)[-3000:]
    assert_ledger(report, 600)
    frames = report["frames"]
    assert frames["processed"] == 600 and frames["lost"] == 0
    assert frames["processed_ids"] == [[0, 599]] and frames["processed_twice"] == 0
    assert report["cluster"]["requeued"], "the removed node's units were run again"
    gone = [row for row in report["cluster"]["nodes"] if row["status"] != "ok"]
    assert len(gone) == 1 and "died" in gone[0]["status"], report["cluster"]["nodes"]


def test_ctrl_c_gives_a_partial_merged_report_and_leaves_nothing(cluster, clean, tmp_path):
    """Ctrl-C while the nodes run: each runner drains (a partial report), frames never fed are
    cancelled, the ledger holds, exit code 130."""
    results = tmp_path / "results"
    proc = start_driver(cluster, results, "--synthetic-count", "5000")
    deadline = time.monotonic() + RUN_TIMEOUT_S / 2
    while not all(node_processes(cluster.tmpdir, label, "yolo-pipeline post") for label in ("fast", "slow")):
        assert time.monotonic() < deadline and proc.poll() is None, driver_log(results)[-3000:]
        time.sleep(0.2)
    time.sleep(1)
    os.killpg(proc.pid, signal.SIGINT)
    code, summary, report = finish(proc, results)
    assert code == 130, driver_log(results)[-3000:]
    assert_ledger(report, 5000)
    assert report["frames"]["processed"] > 0 and report["frames"]["lost"] == 0
    assert report["frames"]["cancelled"] > 0 and summary["cancelled"] == report["frames"]["cancelled"]


def test_without_ray_the_run_is_refused_with_exit_2(tmp_path):
    """ray made unimportable (sys.modules['ray'] = None through sitecustomize): exit 2 naming it."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import sys\nsys.modules['ray'] = None\n")
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{REPO}"}
    done = subprocess.run([sys.executable, str(REPO / "runner.py"), "--ray", "auto", "--results",
                           str(tmp_path / "results"), "--json", "--preset", "none"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert "ray" in json.loads(done.stdout)["error"] and "requirements-ray.txt" in done.stderr
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())


def test_an_address_where_no_cluster_answers_is_refused_in_seconds_with_exit_2(tmp_path):
    """Ray itself retries a wrong address for minutes: the driver tries a TCP connection first.
    Nothing is left in the results folder."""
    from cluster.ray_session import ClusterUnreachable, check_address
    with pytest.raises(ClusterUnreachable, match="HOST:PORT"):
        check_address("nonsense")
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]  # bound, not listening: refused
        started = time.monotonic()
        done = subprocess.run([sys.executable, str(REPO / "runner.py"), "--ray", f"127.0.0.1:{port}", "--results",
                               str(tmp_path / "results"), "--json", "--preset", "none"], cwd=REPO,
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "nothing answers" in json.loads(done.stdout)["error"]
    assert time.monotonic() - started < 60
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())


def test_a_node_that_dies_with_no_runner_leaves_no_folder(cluster, clean):
    """The actor's private folder goes with it even when no runner's guard is there (between runs)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from cluster.node import NodeRunner
    doomed = add_node(cluster, "doomed", num_cpus=1)
    ray.init(address=cluster.address, runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}}, log_to_driver=False)
    try:
        strategy = NodeAffinitySchedulingStrategy(doomed.node_id, soft=False)
        actor = ray.remote(NodeRunner).options(num_cpus=0, scheduling_strategy=strategy).remote("node-x")
        work_dir = Path(ray.get(actor.describe.remote(), timeout=120)["work_dir"])
        assert work_dir.is_dir() and str(work_dir).startswith(cluster.tmpdir), work_dir
        time.sleep(2)  # the actor idles, as between runs
        cluster.remove_node(doomed)
        deadline = time.monotonic() + 20
        while work_dir.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not work_dir.exists()
    finally:
        ray.shutdown()
