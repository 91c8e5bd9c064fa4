"""Sources in object storage (inputs/object_store.py) against a real S3-compatible server on
127.0.0.1 (moto's server mode, tests/store_server.py): a prefix listed into items, an object's
bytes read and decoded, what cannot be reached said, and a whole pipeline run reading from it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import cv2
import numpy as np
import pytest

from inputs.frames import FrameReadError
from inputs.kinds import source_kind
from inputs.object_store import is_store_url, unreachable
from inputs.reader import FrameReader
from inputs.sources import plan_frames
from tests.store_server import BUCKET, fill_bucket, jpeg, s3_server

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OBJECTS = {"imgs/b.jpg": jpeg(1), "imgs/a.jpg": jpeg(2), "imgs/sub/c.jpg": jpeg(3, (40, 30)),
           "imgs/.hidden.jpg": jpeg(4), "imgs/labels.txt": b"not an image", "imgs/broken.jpg": b"not a jpeg",
           "other/d.jpg": jpeg(5)}


@pytest.fixture(scope="module")
def store():
    with pytest.MonkeyPatch.context() as patch, s3_server(patch) as (endpoint, env):
        fill_bucket(OBJECTS)
        yield env


@pytest.mark.parametrize("source, stored", [("s3://b/p", True), ("gs://b", True), ("S3://b", True),
                                             ("http://h/x.mp4", False), ("rtsp://cam", False),
                                             ("file:///x", False), ("data/x.jpg", False), ("0", False)])
def test_store_urls_are_told_from_paths_and_streams_by_their_scheme(source, stored):
    assert is_store_url(source) is stored
    assert (source_kind(source) is not None and source_kind(source).name == "stored") is stored


def test_a_prefix_is_listed_like_a_folder_its_images_named_below_it(store):
    plan = plan_frames(f"s3://{BUCKET}/imgs")
    assert [(i.kind, i.name) for i in plan.items] == [("stored", "a.jpg"), ("stored", "b.jpg"),
                                                      ("stored", "broken.jpg"), ("stored", "sub/c.jpg")]
    assert plan.items[0].location == f"s3://{BUCKET}/imgs/a.jpg" and plan.total == 4
    single = plan_frames(f"s3://{BUCKET}/other/d.jpg")
    assert [(i.name, i.location) for i in single.items] == [("d.jpg", f"s3://{BUCKET}/other/d.jpg")]


def test_an_objects_bytes_are_read_and_decoded_as_a_files_would_be(store):
    plan = plan_frames(f"s3://{BUCKET}/imgs")
    expected = cv2.imdecode(np.frombuffer(OBJECTS["imgs/sub/c.jpg"], np.uint8), cv2.IMREAD_COLOR)
    with FrameReader() as reader:
        frame = reader.read_frame(plan.ref(3))
        assert frame.ref.name == "sub/c.jpg" and frame.original_shape == (40, 30)
        assert np.array_equal(frame.image, expected)
        with pytest.raises(FrameReadError, match="cannot decode"):
            reader.read_frame(plan.ref(2))
        gone = plan.ref(0).__class__(**{**plan.ref(0).__dict__, "location": f"s3://{BUCKET}/imgs/gone.jpg"})
        with pytest.raises(FrameReadError, match="cannot read s3://frames/imgs/gone.jpg"):
            reader.read_frame(gone)


def test_what_names_nothing_readable_is_refused_and_videos_are_named(store):
    fill_bucket({"clips/x.mp4": b"\0" * 10, "clips/y.jpg": jpeg(6)})
    with pytest.raises(ValueError, match=r"1 videos \(x.mp4\): videos are not read from object storage"):
        plan_frames(f"s3://{BUCKET}/clips")
    with pytest.raises(ValueError, match="to hold images"):
        plan_frames(f"s3://{BUCKET}/nothing-here")
    with pytest.raises(ValueError, match="readable object or prefix"):
        plan_frames("s3://no-such-bucket/imgs")
    assert unreachable(f"s3://{BUCKET}/imgs/a.jpg") is None
    assert "FileNotFoundError" in unreachable(f"s3://{BUCKET}/imgs/gone.jpg")


@pytest.mark.slow
def test_a_pipeline_run_reads_its_frames_from_the_store(store, tmp_path):
    """runner.py --source s3://... with the endpoint and dummy credentials in its environment:
    every listed frame accounted, the broken one failed with its reason, images saved by name."""
    done = subprocess.run([sys.executable, "runner.py", "--source", f"s3://{BUCKET}/imgs", "--preset", "none",
                           "--imgsz", "64", "--workers", "1", "--results", str(tmp_path), "--name", "run", "--json",
                           "--no-progress", "--save-images", "all", "--allow-failures"],
                          cwd=REPO, env={**os.environ, **store}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    frames = report["frames"]
    assert (frames["in"], frames["processed"], frames["failed"]) == (4, 3, 1), frames
    assert "cannot decode" in frames["failures"][0]["reason"] and frames["failures"][0]["name"] == "broken.jpg"
    saved = sorted(str(p.relative_to(tmp_path / "run" / "images")) for p in (tmp_path / "run" / "images").rglob("*.jpg"))
    assert saved == ["a.jpg", "b.jpg", "sub/c.jpg"]
    assert "testing" not in (tmp_path / "run" / "report.json").read_text(), "no credential in the report"
