"""The merged run on made-up runs (no Ray): its exit code; in a store (fsspec's memory file
system), the parts of a video that an aborted runner left, each kept under its own name."""

from __future__ import annotations

import json
import secrets
from types import SimpleNamespace

import fsspec

from cluster.inbox import Inbox
from cluster.report import exit_code_of
from cluster.work import Unit, continued_videos


def test_a_node_whose_outputs_were_refused_makes_the_run_exit_4_naming_it():
    node = SimpleNamespace(label="node-1", gone="")
    said = "PermissionError: Access Denied writing s3://o/r/images/a.jpg"
    refused = {"exit_code": 4, "stdout": json.dumps({"reason": said})}
    cluster = SimpleNamespace(interrupted_by=0, nodes=[node], runs=[SimpleNamespace(node=node, result=refused)])
    frames = {"failed": 0, "lost": 0}
    assert exit_code_of(cluster, frames, False) == (4, f"node-1: {said}")
    refused["exit_code"] = 0
    assert exit_code_of(cluster, frames, False) == (0, "finished")


def test_the_parts_of_a_video_an_aborted_runner_left_in_a_store_keep_their_own_names(tmp_path):
    fed = [Unit(0, 10, "video", "/v/clip.mp4", "clip.mp4", 0), Unit(10, 5, "video", "/v/b.mp4", "b.mp4", 1),
           Unit(15, 1, "image", "/v/x.jpg", "x.jpg", 2)]
    unread = [fed[0].rest({0, 1, 2, 3}), fed[1], fed[2]]  # clip.mp4 read in part; b.mp4 never begun
    assert continued_videos(fed, unread) == [unread[0]]
    root = f"memory://runs-{secrets.token_hex(4)}/r1"
    fs = fsspec.filesystem("memory")
    inbox = Inbox.of_run(str(tmp_path / "r1"), root.rsplit("/", 1)[0])
    assert inbox.store_root == root
    (tmp_path / "r1").mkdir()
    fs.pipe_file(f"{root}/videos/clip.mp4", b"frames 1-4")  # copied by the aborted runner
    inbox.video_continued("clip.mp4")
    fs.pipe_file(f"{root}/videos/clip.mp4", b"frames 5-8")  # the next runner aborts too
    inbox.video_continued("clip.mp4")
    inbox.video_continued("b.mp4")  # no part of it was written: nothing to set aside
    fs.pipe_file(f"{root}/videos/clip.mp4", b"frames 9-10")
    inbox.write_lists(["thing"])
    videos = {path.rsplit("/", 1)[-1]: fs.cat_file(path) for path in fs.find(f"{root}/videos")}
    assert videos == {"clip.mp4": b"frames 1-4", "clip.part2.mp4": b"frames 5-8", "clip.part3.mp4": b"frames 9-10"}
