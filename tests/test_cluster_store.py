"""Cluster runs whose source, or results, are in object storage: a real S3-compatible server on
127.0.0.1 (moto's server mode) and ray.cluster_utils.Cluster nodes on this machine. A node whose
endpoint points nowhere is named before the run starts (exit 2); a node removed mid-run keeps what
it had delivered, the rest runs on the other node, every frame once and every output written.
With ``--results s3://...`` the nodes write their outputs to the store themselves (the driver gets
none of their bytes) and the driver uploads the merged reports; a node whose credentials may not
write there is named before the run (exit 2); a name a run still writes is refused (exit 2).

Every process uses the keys of an IAM user allowed everything (made on the server first), so that a
test can enforce moto's IAM for a node given a user who may not write."""

from __future__ import annotations

import contextlib
import glob
import json
import os
from collections import Counter
import secrets
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
    with pytest.MonkeyPatch.context() as patch, s3_server(patch) as (endpoint, env):
        admin = iam_user(endpoint, [{"Effect": "Allow", "Action": "*", "Resource": "*"}])
        for key, value in admin.items():
            patch.setenv(key, value)
        fill_bucket({f"imgs/{i // 100}/{i:04d}.jpg": jpeg(i) for i in range(IMAGES)})
        yield {**env, **admin}


def iam_user(endpoint: str, statements: list) -> dict:
    """The keys of a new IAM user of moto's with these policy statements."""
    import boto3
    iam = boto3.client("iam", endpoint_url=endpoint)
    name = f"user-{secrets.token_hex(4)}"
    iam.create_user(UserName=name)
    iam.put_user_policy(UserName=name, PolicyName="p", PolicyDocument=json.dumps({"Version": "2012-10-17",
                                                                                 "Statement": statements}))
    key = iam.create_access_key(UserName=name)["AccessKey"]
    return {"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}


@contextlib.contextmanager
def iam_enforced(endpoint: str):
    import requests
    requests.post(f"{endpoint}/moto-api/reset-auth", data=b"0", proxies={"http": ""})
    try:
        yield
    finally:
        requests.post(f"{endpoint}/moto-api/reset-auth", data=b"inf", proxies={"http": ""})


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
            folder = os.path.dirname(config)  # its run folder: run/, or results/NAME/ with a results store
            for journal in glob.glob(os.path.join(folder, "run", JOURNAL_NAME)) + glob.glob(
                    os.path.join(folder, "results", "*", JOURNAL_NAME)):
                with open(journal, "rb") as f:
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


def run_removing_a_node(store_cluster, results, env: dict, *flags: str):
    """A driver run on the cluster plus a slow node, removed once it journaled VICTIM_FRAMES
    frames; (exit code, --json summary, report) when the run ends."""
    victim = add_node(store_cluster, "victim", num_cpus=1, slow="pre:5")
    proc = start_driver(store_cluster, results, *flags, env=env)
    deadline = time.monotonic() + RUN_TIMEOUT_S / 2
    while journaled(store_cluster.tmpdir, "victim") < VICTIM_FRAMES:
        assert time.monotonic() < deadline and proc.poll() is None, driver_log(results)[-3000:]
        time.sleep(0.1)
    time.sleep(1.0)  # the driver pulls every 0.25 s: some of what it finished has come
    store_cluster.remove_node(victim)
    return finish(proc, results)


def test_a_node_removed_mid_run_keeps_what_it_sent_and_every_output_is_written_once(store, store_cluster, tmp_path):
    results = tmp_path / "results"
    code, summary, report = run_removing_a_node(store_cluster, results, store, "--source", f"s3://{BUCKET}/imgs",
                                                "--save-images", "all", "--save-txt", "--save-crop", *model_flags())
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


def stored(prefix: str) -> list[str]:
    """The keys below ``prefix`` (bucket/...), relative to it."""
    from s3fs import S3FileSystem
    fs = S3FileSystem(skip_instance_cache=True)
    return sorted(k.removeprefix(prefix + "/") for k in fs.find(prefix))


def read_stored(key: str) -> bytes:
    from s3fs import S3FileSystem
    return S3FileSystem(skip_instance_cache=True).cat_file(key)


def test_results_in_a_store_are_written_by_the_nodes_and_a_node_removed_mid_run_loses_none(store, store_cluster,
                                                                                          tmp_path):
    """300 images from the store, their outputs to ``s3://frames/runs/r1``: each node PUTs its
    annotated images, labels and crops there under their global names, the driver receives none of
    their bytes and uploads the merged report files (report.json last, the name's claim removed);
    a node removed mid-run keeps what it delivered, the rest is written again by the other node
    under the same names: every output once, every frame counted once."""
    results, driver_tmp = tmp_path / "results", tmp_path / "driver-tmp"
    driver_tmp.mkdir()
    code, summary, _local = run_removing_a_node(
        store_cluster, results, {**store, "TMPDIR": str(driver_tmp)}, "--source", f"s3://{BUCKET}/imgs", "--results",
        f"s3://{BUCKET}/runs", "--name", "r1", "--save-images", "all", "--save-txt", "--save-crop", *model_flags())
    assert code == 0, driver_log(results)[-3000:]
    root = f"{BUCKET}/runs/r1"
    assert summary["run_dir"] == f"s3://{root}", summary
    report = json.loads(read_stored(f"{root}/report.json"))
    assert_ledger(report, IMAGES)
    frames = report["frames"]
    assert frames["processed_ids"] == [[0, IMAGES - 1]] and frames["processed_twice"] == 0, frames
    rows = {row["status"] == "ok": row for row in report["cluster"]["nodes"]}
    assert "died" in rows[False]["status"] and rows[False]["processed"] > 0, "what it delivered before it went counts"
    assert rows[False]["processed"] + rows[True]["processed"] == IMAGES and report["cluster"]["requeued"]
    keys = stored(root)
    images = [k.removeprefix("images/") for k in keys if k.startswith("images/")]
    assert images == [f"{i // 100}/{i:04d}.jpg" for i in range(IMAGES)], "every annotated image once, by its name"
    for name in ("report.json", "report.md", "detections.json", "predictions.json", "trace.json"):
        assert name in keys, keys[:20]
    assert not [k for k in keys if k.rsplit("/", 1)[-1].startswith(".")], "no claim, marker or partial object left"
    records = json.loads(read_stored(f"{root}/detections.json"))
    per_image = Counter(r["image"] for r in records)
    labels = {k.removeprefix("labels/")[:-4] + ".jpg": len(read_stored(f"{root}/{k}").splitlines())
              for k in keys if k.startswith("labels/")}
    assert labels == dict(per_image), "each frame's records once, as many as its label lines, whichever node"
    assert len([k for k in keys if k.startswith("crops/")]) == len(records)
    assert report["outputs"]["streamed_bytes"] == 0, "the driver received no output bytes"
    assert report["outputs"]["files"]["images"] == IMAGES, report["outputs"]
    assert not results.exists(), "nothing of the run on the driver's disk"
    assert not list(driver_tmp.glob("yolo-cluster-*")), "the driver's private folder went"
    secrets_in = read_stored(f"{root}/report.json") + read_stored(f"{root}/report.md")
    assert store["AWS_SECRET_ACCESS_KEY"].encode() not in secrets_in and store["AWS_ACCESS_KEY_ID"].encode() not in \
        secrets_in, "no credential in the report"
    print(f"victim delivered {rows[False]['processed']} frames before it was removed; "
          f"{report['cluster']['requeued'][0]['frames']} ran again on the other node; {len(records)} detections; "
          f"{len(keys)} objects in the store")


def test_a_node_that_may_not_write_in_the_results_store_is_named_before_the_run(store, store_cluster, tmp_path,
                                                                                monkeypatch):
    """moto's IAM enforced, one node's user denied PutObject below the results prefix: exit 2 naming
    that node and the object it could not write, no run folder made in the store."""
    endpoint = store["AWS_ENDPOINT_URL"]
    reader = iam_user(endpoint, [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"},
                                 {"Effect": "Deny", "Action": "s3:PutObject",
                                  "Resource": [f"arn:aws:s3:::{BUCKET}/runs/*"]}])
    for key, value in reader.items():
        monkeypatch.setenv(key, value)  # what the next node inherits
    reading = add_node(store_cluster, "reader", num_cpus=1)
    for key in reader:
        monkeypatch.setenv(key, store[key])
    try:
        labels = sorted(n.node_id for n in store_cluster.worker_nodes)  # as the driver names them (the head has no CPU)
        label = f"node-{labels.index(reading.node_id)}"
        results = tmp_path / "results"
        with iam_enforced(endpoint):
            proc = start_driver(store_cluster, results, "--results", f"s3://{BUCKET}/runs", "--name", "denied",
                                "--synthetic-count", "8", env=store)
            code, summary, _report = finish(proc, results)
        assert code == 2, driver_log(results)[-3000:]
        error = summary["error"]
        assert error.count("cannot write") == 1 and f"{label} (" in error, error
        assert f"cannot write in s3://{BUCKET}/runs: PermissionError: " in error, error
        assert f"writing s3://{BUCKET}/runs/.write-check-" in error, error
        print(error)
        assert not [k for k in stored(f"{BUCKET}/runs") if k.startswith("denied/") or ".write-check-" in k]
    finally:
        store_cluster.remove_node(reading)


def test_a_name_that_a_run_still_writes_in_the_store_is_refused(store, store_cluster, tmp_path):
    """RESULTS/NAME/.running (a run in progress, or one that was killed): exit 2 before Ray is
    joined, the claim named; --exist-ok goes on."""
    from s3fs import S3FileSystem
    S3FileSystem(skip_instance_cache=True).pipe_file(
        f"{BUCKET}/runs/busy/.running", json.dumps({"host": "elsewhere", "pid": 4242, "started_unix": 0}).encode())
    results = tmp_path / "results"
    proc = start_driver(store_cluster, results, "--results", f"s3://{BUCKET}/runs", "--name", "busy",
                        "--synthetic-count", "4", env=store)
    code, summary, _report = finish(proc, results)
    assert code == 2, driver_log(results)[-3000:]
    assert f"'s3://{BUCKET}/runs/busy' is being written by a run on elsewhere (pid 4242)" in summary["error"], summary
    assert "--exist-ok" in summary["error"] and "cluster:" not in driver_log(results), "refused before Ray is joined"
    proc = start_driver(store_cluster, results, "--results", f"s3://{BUCKET}/runs", "--name", "busy", "--exist-ok",
                        "--synthetic-count", "4", "--save-images", "all", env=store)
    code, summary, _report = finish(proc, results)
    assert code == 0, driver_log(results)[-3000:]
    keys = stored(f"{BUCKET}/runs/busy")
    assert len([k for k in keys if k.startswith("images/")]) == 4 and "report.json" in keys and ".running" not in keys
