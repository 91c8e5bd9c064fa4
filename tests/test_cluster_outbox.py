"""A node's outputs leaving it while its runner runs (cluster/outbox.py), on a run folder written
as the collector and postprocess write it: files go once no frame that may still write them is
left, in chunks of bounded size, and a unit is delivered only whole (journaled, its records read,
no file of it left)."""

from __future__ import annotations

import json
import os

from cluster.outbox import Outbox, output_rest
from collector.journal import JOURNAL_NAME

PARTIAL = ".detections.json.123.abcdef01.partial"


def record(frame: int, score: float) -> dict:
    return {"image": "x", "frame": frame, "class_id": 0, "class": "person", "score": score, "box": [0, 0, 1, 1]}


def write(run_dir, relative: str, data: bytes) -> None:
    path = os.path.join(run_dir, relative)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def journal_line(local: int, records: int) -> str:
    return json.dumps({"f": [local, 1, 1, 0, records, records, records, [], []]}) + "\n"


def taken(outbox: Outbox, max_bytes: int = 1 << 20) -> tuple[dict, list[str]]:
    chunk = outbox.take(max_bytes)
    return chunk, [p[0] for p in chunk["pieces"] if p[3]]


def test_output_paths_start_with_their_frames_stem_below_their_folder():
    assert output_rest("images/dir/x.jpg") == "dir/x.jpg"
    assert output_rest("crops/person/dir/x2.jpg") == "dir/x2.jpg"
    assert output_rest("labels/clip_17.txt") == "clip_17.txt"


def test_files_go_when_no_unfinished_frame_may_write_them_and_units_are_delivered_whole(tmp_path):
    run_dir = str(tmp_path)
    outbox = Outbox(run_dir)
    outbox.fed("a.jpg", [0], [10])
    outbox.fed("ab.jpg", [1], [11])
    outbox.fed("clip.mp4", [2, 3], [12, 13])
    for relative in ("images/a.jpg", "labels/a.txt", "crops/person/a2.jpg", "images/ab.jpg", "videos/clip.mp4",
                     "images/clip.mp4_000001.jpg"):
        write(run_dir, relative, relative.encode())
    write(run_dir, JOURNAL_NAME, journal_line(0, 2).encode())
    write(run_dir, PARTIAL, ("[\n" + json.dumps(record(0, 0.9)) + ",\n" + json.dumps(record(0, 0.8))).encode())
    outbox.read_journal()
    chunk, sent = taken(outbox)
    assert sorted(sent) == ["crops/person/a2.jpg", "images/a.jpg", "labels/a.txt"]
    assert chunk["frames"] == [] and not chunk["done"], "a.jpg waits: ab.jpg, not journaled yet, starts with 'a'"

    with open(os.path.join(run_dir, PARTIAL), "ab") as f:
        f.write(b",\n" + json.dumps(record(1, 0.7)).encode())  # the separator comes with the next record
    with open(os.path.join(run_dir, JOURNAL_NAME), "a") as f:
        f.write(journal_line(1, 1))
    outbox.read_journal()
    chunk, sent = taken(outbox)
    assert sent == ["images/ab.jpg"]
    assert chunk["frames"] == [(10, None), (11, None)]
    assert [(r["frame"], r["score"]) for r in chunk["records"]] == [(10, 0.9), (10, 0.8), (11, 0.7)], "each once"

    write(run_dir, "detections.json", ("[\n" + ",\n".join(json.dumps(r) for r in [
        record(0, 0.9), record(0, 0.8), record(1, 0.7), record(3, 0.5)]) + "\n]\n").encode())
    outbox.finished({"frames": {"processed_ids": [[0, 2]], "failures": [{"id": 3, "reason": "cannot decode"}]}})
    pieces = []
    while True:
        chunk = outbox.take(7)
        pieces += chunk["pieces"]
        assert sum(len(p[2]) for p in chunk["pieces"]) <= 7
        if chunk["frames"]:
            delivered = chunk
        if chunk["done"]:
            break
    assert b"".join(p[2] for p in pieces if p[0] == "videos/clip.mp4") == b"videos/clip.mp4"
    assert delivered["frames"] == [(12, None), (13, {"id": 3, "reason": "cannot decode"})]
    assert [(r["frame"], r["score"]) for r in delivered["records"]] == [(13, 0.5)]
    assert not [n for top in ("images", "videos") for _r, _d, n in os.walk(tmp_path / top) if n]


def test_a_cut_back_list_is_read_again_without_counting_a_record_twice(tmp_path):
    run_dir = str(tmp_path)
    outbox = Outbox(run_dir)
    outbox.fed("a.jpg", [0], [4])
    write(run_dir, PARTIAL, ("[\n" + json.dumps(record(0, 0.9)) + ",\n" + json.dumps(record(0, 0.1))).encode())
    outbox.read_records()
    write(run_dir, PARTIAL, ("[\n" + json.dumps(record(0, 0.9))).encode())  # a restarted collector cut it back
    write(run_dir, JOURNAL_NAME, journal_line(0, 1).encode())
    outbox.read_journal()
    chunk, _ = taken(outbox)
    assert chunk["frames"] == [(4, None)] and [r["score"] for r in chunk["records"]] == [0.9]
