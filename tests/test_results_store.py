"""Run folders in an object store (``--results s3://bucket/prefix``) against a real S3-compatible
server on 127.0.0.1 (moto's server mode, tests/store_server.py): a whole run's folder in the
bucket and nothing left locally, a missing bucket refused before the run, and a store that refuses
some writes (moto's IAM, enforced: a user whose policy denies them) as a full disk is: saving stops,
every frame is counted, exit 4."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys

import numpy as np
import pytest

from collector.videos import AnnotatedVideos
from supervisor.prepare import check_results_dir, free_run_name, make_run_dir
from supervisor.stored_runs import upload_run_folder
from supervisor.run import Outcome, _uploaded
from settings.config import ConfigError, RunConfig
from tests.store_server import jpeg, s3_server
from workers.postprocess import Outputs
from workers.store import run_root

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUCKET = "out"
RUN_FLAGS = ("--imgsz", "320", "--workers", "1", "--infer-workers", "1", "--no-progress", "--json")


@pytest.fixture(scope="module")
def store():
    with pytest.MonkeyPatch.context() as patch, s3_server(patch) as (endpoint, env):
        import fsspec
        fsspec.filesystem("s3", skip_instance_cache=True).mkdir(BUCKET)
        yield endpoint, env


@pytest.fixture
def source(tmp_path, fixtures_dir):
    folder = tmp_path / "imgs"
    folder.mkdir()
    for name in ("bus.jpg", "zidane.jpg"):
        shutil.copy(fixtures_dir / name, folder / name)
    for seed in (1, 2):
        (folder / f"noise{seed}.jpg").write_bytes(jpeg(seed))
    return folder


def s3(**credentials):
    from s3fs import S3FileSystem
    return S3FileSystem(skip_instance_cache=True, **credentials)


def keys(prefix: str, **credentials) -> list[str]:
    fs = s3(**credentials)
    return sorted(k.removeprefix(f"{prefix}/") for k in fs.find(prefix)) if fs.exists(prefix) else []


def run_runner(tmp_path, env: dict, *flags: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """runner.py in a subprocess with its own TMPDIR; (the process, what it left in TMPDIR)."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir(exist_ok=True)
    done = subprocess.run([sys.executable, "runner.py", *RUN_FLAGS, *flags], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, **env, "TMPDIR": str(tmpdir)}, timeout=300)
    return done, sorted(n for n in os.listdir(tmpdir) if n.startswith("yolo"))


@pytest.mark.slow
def test_a_run_writes_its_run_folder_into_the_store_and_nothing_stays_local(store, source, tmp_path, fixtures_dir):
    endpoint, env = store
    done, left = run_runner(tmp_path, env, "--results", f"s3://{BUCKET}/runs", "--name", "r1", "--source", str(source),
                            "--weights", str(fixtures_dir / "yolov5n.pt"), "--save-images", "all", "--save-txt")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["run_dir"] == f"s3://{BUCKET}/runs/r1"
    assert left == [], "the local run folder stayed"
    found = keys(f"{BUCKET}/runs/r1")
    images = ["bus.jpg", "noise1.jpg", "noise2.jpg", "zidane.jpg"]
    assert [k for k in found if k.startswith("images/")] == [f"images/{n}" for n in images]
    assert {"report.json", "report.md", "detections.json", "predictions.json", "run.log", "trace.json",
            "modules.csv", "labels/bus.txt", "labels/zidane.txt"} <= set(found), found
    assert not [k for k in found if k.rsplit("/", 1)[-1].startswith(".")], "a journal or partial list was uploaded"
    fs = s3()
    report = json.loads(fs.cat(f"{BUCKET}/runs/r1/report.json"))
    frames = report["frames"]
    assert (frames["in"], frames["processed"], frames["failed"], frames["accounted"]) == (4, 4, 0, True)
    assert report["summary"]["run_dir"] == f"s3://{BUCKET}/runs/r1"
    detections = json.loads(fs.cat(f"{BUCKET}/runs/r1/detections.json"))
    lines = sum(len(fs.cat(f"{BUCKET}/runs/r1/{k}").splitlines()) for k in found if k.startswith("labels/"))
    assert len(detections) == lines > 0
    for name in ("report.json", "run.log"):
        assert env["AWS_SECRET_ACCESS_KEY"] not in fs.cat(f"{BUCKET}/runs/r1/{name}").decode(), "a credential"
    assert free_run_name(f"s3://{BUCKET}/runs", "r1", False) == "r12"  # a finished run's name is taken
    assert free_run_name(f"s3://{BUCKET}/runs", "r1", True) == "r1"


@pytest.mark.slow
def test_a_bucket_that_does_not_exist_is_exit_2_naming_it(store, tmp_path):
    done, left = run_runner(tmp_path, store[1], "--results", "s3://no-such-bucket/runs", "--preset", "none",
                            "--frames", "4")
    assert done.returncode == 2, done.stderr[-3000:]
    assert "--results: cannot write run folders in 's3://no-such-bucket/runs'" in done.stderr
    assert "bucket does not exist" in done.stderr
    assert left == [] and json.loads(done.stdout)["run_dir"] is None


def test_the_check_before_the_run_writes_and_removes_a_marker(store):
    check_results_dir(f"s3://{BUCKET}/checked")
    assert keys(f"{BUCKET}/checked") == []
    with pytest.raises(ConfigError, match="no-such-bucket"):
        check_results_dir("s3://no-such-bucket/x")


@pytest.fixture
def refusing_user(store):
    """Credentials of a user whose policy denies ``PutObject`` on the keys a test names, with
    moto's IAM enforced until the test ends (the others' dummy credentials are then refused)."""
    import boto3
    import requests
    endpoint, _env = store
    iam = boto3.client("iam", endpoint_url=endpoint)

    def user(*denied: str) -> dict:
        name = f"runner-{secrets.token_hex(4)}"
        iam.create_user(UserName=name)
        statements = [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"},
                      {"Effect": "Deny", "Action": "s3:PutObject", "Resource": [f"arn:aws:s3:::{d}" for d in denied]}]
        iam.put_user_policy(UserName=name, PolicyName="deny", PolicyDocument=json.dumps({"Version": "2012-10-17",
                                                                                         "Statement": statements}))
        key = iam.create_access_key(UserName=name)["AccessKey"]
        requests.post(f"{endpoint}/moto-api/reset-auth", data=b"0", proxies={"http": ""})
        return {"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}

    try:
        yield user
    finally:
        requests.post(f"{endpoint}/moto-api/reset-auth", data=b"inf", proxies={"http": ""})


@pytest.mark.slow
def test_a_store_that_refuses_the_images_is_exit_4_with_every_frame_counted(store, refusing_user, source, tmp_path):
    credentials = refusing_user(f"{BUCKET}/runs/r3/images/*")
    done, left = run_runner(tmp_path, {**store[1], **credentials}, "--results", f"s3://{BUCKET}/runs", "--name", "r3",
                            "--source", str(source), "--preset", "none", "--save-images", "all")
    assert done.returncode == 4, done.stderr[-3000:]
    assert left == []
    summary = json.loads(done.stdout)
    assert (summary["frames_in"], summary["processed"], summary["failed"]) == (4, 4, 0)
    errors = [line for line in done.stderr.splitlines() if "image and label saving stopped" in line]
    assert len(errors) == 2 and errors[1].endswith("(exit code 4)"), errors  # the collector's, and the exit's
    assert "PermissionError: Access Denied writing s3://out/runs/r3/images/" in errors[0]
    user = {"key": credentials["AWS_ACCESS_KEY_ID"], "secret": credentials["AWS_SECRET_ACCESS_KEY"]}
    found = keys(f"{BUCKET}/runs/r3", **user)
    assert "report.json" in found and "detections.json" in found and not [k for k in found if k.startswith("images/")]
    report = json.loads(s3(**user).cat(f"{BUCKET}/runs/r3/report.json"))
    assert report["frames"]["accounted"] and "Access Denied" in report["outputs"]["image_error"]


def test_a_refused_upload_is_exit_4_naming_the_file_and_the_others_still_go(store, refusing_user, tmp_path):
    credentials = refusing_user(f"{BUCKET}/up/report.md")
    folder = tmp_path / "up"
    (folder / "plots").mkdir(parents=True)
    for name in ("report.json", "report.md", "plots/a.png", ".collector-journal.partial"):
        (folder / name).write_bytes(b"x")
    with pytest.MonkeyPatch.context() as patch:
        for key, value in credentials.items():
            patch.setenv(key, value)
        s3().clear_instance_cache()  # fsspec keeps a file system per set of options, made with other keys
        outcome = _uploaded(RunConfig(results=f"s3://{BUCKET}"), Outcome(0, str(folder), {"run_dir": str(folder)}))
    url = f"s3://{BUCKET}/up"
    assert (outcome.exit_code, outcome.run_dir, outcome.summary["run_dir"]) == (4, url, url)
    assert outcome.reason == f"could not upload 1 files of the run folder to s3://{BUCKET}/up, report.md: " \
        "PermissionError: Access Denied"
    user = {"key": credentials["AWS_ACCESS_KEY_ID"], "secret": credentials["AWS_SECRET_ACCESS_KEY"]}
    assert keys(f"{BUCKET}/up", **user) == ["plots/a.png", "report.json"]


class _Log:
    def __init__(self):
        self.lines = []

    def info(self, message, *args):
        self.lines.append(message % args)


class _Cfg:
    save_txt = save_conf = save_crop = True

    def __init__(self, results):
        self.results = results


def test_outputs_write_under_the_run_root_and_stop_once_when_the_store_refuses(store, tmp_path):
    image = np.zeros((8, 8, 3), np.uint8)
    outputs = Outputs(str(tmp_path / "r5"), _Cfg(f"s3://{BUCKET}/runs"), _Log())
    assert outputs.store.root == f"s3://{BUCKET}/runs/r5"
    assert outputs.save_image("sub/a.jpg", image)
    outputs.write_labels("sub/a.jpg", ["0 0.5 0.5 0.1 0.1"])
    assert keys(f"{BUCKET}/runs/r5") == ["images/sub/a.jpg", "labels/sub/a.txt"]
    assert not (tmp_path / "r5").exists(), "nothing written locally"
    log = _Log()
    gone = Outputs(str(tmp_path / "r6"), _Cfg("s3://no-such-bucket/runs"), log)
    assert not gone.save_image("a.jpg", image) and not gone.save_image("b.jpg", image)
    assert gone.saved == 0 and len(log.lines) == 1
    assert gone.error.startswith("FileNotFoundError: ") and "s3://no-such-bucket/runs/r6/images/a.jpg" in gone.error


def test_a_closed_video_is_copied_to_the_store_and_its_local_file_removed(store, tmp_path):
    frame = np.full((32, 48, 3), 90, np.uint8)
    for results, bucket_has in ((f"s3://{BUCKET}/runs", True), ("s3://no-such-bucket/runs", False)):
        run_dir = tmp_path / ("ok" if bucket_has else "refused")
        videos = AnnotatedVideos(str(run_dir), ["thing"], 1, store=run_root(results, str(run_dir)))
        for index in range(3):
            videos.add("clip.mp4:0", 0, {"item": 0, "index": index, "fps": 10.0}, [], lambda: frame, lambda: None)
        written = videos.finish()
        assert written[0]["video"] == "videos/clip.mp4" and written[0]["frames"] == 3
        assert not (run_dir / "videos" / "clip.mp4").exists(), "the local copy stayed"
        if bucket_has:
            assert keys(f"{BUCKET}/runs/ok") == ["videos/clip.mp4"] and videos.error is None
            assert s3().size(f"{BUCKET}/runs/ok/videos/clip.mp4") > 0
        else:
            assert "copying videos/clip.mp4 to s3://no-such-bucket/runs/refused/videos/clip.mp4" in videos.error


def test_a_name_that_a_run_still_writes_is_refused_unless_exist_ok(store, tmp_path):
    """A run claims its name with RESULTS/NAME/.running until its report.json is up: a second run
    given that name meanwhile is refused (exit 2), a finished one gives NAME2 as for folders."""
    results = f"s3://{BUCKET}/names"
    s3().pipe_file(f"{BUCKET}/names/busy/.running", json.dumps({"host": "h1", "pid": 7, "started_unix": 0}).encode())
    with pytest.raises(ConfigError, match=r"'s3://out/names/busy' is being written by a run on h1 \(pid 7\)"):
        free_run_name(results, "busy", exist_ok=False)
    assert free_run_name(results, "busy", exist_ok=True) == "busy"
    run_dir = make_run_dir(results, "fresh", False, str(tmp_path))
    assert keys(f"{BUCKET}/names/fresh") == [".running"], "claimed at once"
    with pytest.raises(ConfigError, match="being written by a run on"):
        free_run_name(results, "fresh", exist_ok=False)
    with open(os.path.join(run_dir, "report.json"), "w") as f:
        f.write("{}")
    assert upload_run_folder(run_dir, f"{results}/fresh") == {}
    assert keys(f"{BUCKET}/names/fresh") == ["report.json"], "released once the report is up"
    assert free_run_name(results, "fresh", exist_ok=False) == "fresh2"
