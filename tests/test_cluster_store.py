"""Cluster runs whose source is in object storage: a real S3-compatible server on 127.0.0.1
(moto's server mode) and ray.cluster_utils.Cluster nodes on this machine. A node whose endpoint
points nowhere is named before the run starts (exit 2); a node removed mid-run keeps what it had
delivered, the rest runs on the other node, every frame once and every output written."""

from __future__ import annotations

import json
import os
from collections import Counter
import shutil
import socket
import tempfile
import time

import psutil
import pytest

from collector.journal import JOURNAL_NAME
from tests.conftest import FIXTURES_DIR
from tests.store_server import BUCKET, fill_bucket, jpeg, s3_server
from tests.test_cluster import (RUN_TIMEOUT_S, add_node, assert_ledger, driver_log, finish, node_processes,
                                start_driver)

ray = pytest.importorskip("ray", reason="ray is not installed (pip install -r requirements-ray.txt)")
from ray.cluster_utils import Cluster  # noqa: E402

IMAGES = 300
VICTIM_FRAMES = 20  # journaled on the victim before it is removed


@pytest.fixture(scope="module")
def store():
    with pytest.MonkeyPatch.context() as patch, s3_server(patch) as (_endpoint, env):
        fill_bucket({f"imgs/{i // 100}/{i:04d}.jpg": jpeg(i) for i in range(IMAGES)})
        yield env


@pytest.fixture(scope="module")
def store_cluster(store):
    """A head without CPUs and one node that reaches the store (the nodes inherit this process's
    environment, the store's endpoint in it)."""
    made = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    made.tmpdir = tempfile.mkdtemp(prefix="rs-", dir="/tmp")
    made.labels = {add_node(made, "steady", num_cpus=1, slow="pre:5").node_id: "steady"}
    yield made
    made.shutdown()
    shutil.rmtree(made.tmpdir, ignore_errors=True)


def model_flags() -> list[str]:
    """The real yolov5n at a low threshold where the fixture is there (detections, labels and
    crops to stream); no model otherwise."""
    weights = FIXTURES_DIR / "yolov5n.pt"
    return ["--weights", str(weights), "--imgsz", "160", "--conf", "0.02"] if weights.is_file() else []


def journaled(tmpdir: str, label: str) -> int:
    """Frames the collector of node ``label``'s runner journaled so far (its run folder is named
    in the runner's command line)."""
    for pid in node_processes(tmpdir, label, "runner.py"):
        try:
            config = psutil.Process(pid).cmdline()[-3]  # ... runner.py --config PATH --json --no-progress
            with open(os.path.join(os.path.dirname(config), "run", JOURNAL_NAME), "rb") as f:
                return f.read().count(b'{"f":')
        except (psutil.Error, OSError, IndexError):
            continue
    return 0


def closed_port() -> int:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        return unused.getsockname()[1]


def test_a_node_that_cannot_reach_the_store_is_named_before_the_run(store, store_cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{closed_port()}")  # what the next node inherits
    blind = add_node(store_cluster, "blind", num_cpus=1)
    monkeypatch.setenv("AWS_ENDPOINT_URL", store["AWS_ENDPOINT_URL"])
    try:
        results = tmp_path / "results"
        started = time.monotonic()
        proc = start_driver(store_cluster, results, "--source", f"s3://{BUCKET}/imgs", env=store)
        code, summary, _report = finish(proc, results)
        assert code == 2, driver_log(results)[-3000:]
        assert f"cannot read s3://{BUCKET}/imgs/" in summary["error"] and "node-" in summary["error"], summary
        assert summary["error"].count("cannot read") == 3, "the blind node only, each sampled object named"
        assert not (results / "run").exists(), "no run folder for a run that never started"
        assert time.monotonic() - started < 120
    finally:
        store_cluster.remove_node(blind)


def test_a_node_removed_mid_run_keeps_what_it_sent_and_every_output_is_written_once(store, store_cluster, tmp_path):
    victim = add_node(store_cluster, "victim", num_cpus=1, slow="pre:5")
    results = tmp_path / "results"
    proc = start_driver(store_cluster, results, "--source", f"s3://{BUCKET}/imgs", "--save-images", "all",
                        "--save-txt", "--save-crop", *model_flags(), env=store)
    deadline = time.monotonic() + RUN_TIMEOUT_S / 2
    while journaled(store_cluster.tmpdir, "victim") < VICTIM_FRAMES:
        assert time.monotonic() < deadline and proc.poll() is None, driver_log(results)[-3000:]
        time.sleep(0.1)
    time.sleep(1.0)  # the driver pulls every 0.25 s: some of what it finished has come
    store_cluster.remove_node(victim)
    code, summary, report = finish(proc, results)
    assert code == 0, driver_log(results)[-3000:]
    assert_ledger(report, IMAGES)
    frames = report["frames"]
    assert frames["processed"] == IMAGES and frames["processed_ids"] == [[0, IMAGES - 1]]
    assert frames["processed_twice"] == 0 and report["cluster"]["requeued"], report["cluster"]
    rows = {row["status"] == "ok": row for row in report["cluster"]["nodes"]}
    assert "died" in rows[False]["status"] and rows[False]["processed"] > 0, "what it delivered before it went counts"
    assert rows[False]["processed"] + rows[True]["processed"] == IMAGES
    run = results / "run"
    images = sorted(str(p.relative_to(run / "images")) for p in (run / "images").rglob("*.jpg"))
    assert images == [f"{i // 100}/{i:04d}.jpg" for i in range(IMAGES)], "every annotated image once, by its name"
    assert not [p for p in run.rglob(".*") if p.is_file()], "no partial copy or spill file left"
    records = json.loads((run / "detections.json").read_text())
    per_image = Counter(r["image"] for r in records)
    labels = {str(p.relative_to(run / "labels"))[:-4] + ".jpg": len(p.read_text().splitlines())
              for p in (run / "labels").rglob("*.txt")}
    assert labels == dict(per_image), "each frame's records once, as many as its label lines, whichever node"
    assert len(list((run / "crops").rglob("*.jpg"))) == len(records) and {r["frame"] for r in records} <= set(
        range(IMAGES))
    print(f"victim delivered {rows[False]['processed']} frames before it was removed; "
          f"{report['cluster']['requeued'][0]['frames']} ran again on the other node; {len(records)} detections")
