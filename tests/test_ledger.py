"""The collector's ledger keeps a processed frame in a few typed-array rows, not a dict, and gives
the same frame dicts back; detections stream to a JSON file that appears only when whole."""

import errno
import json

import pytest

from analysis.atomic import JsonListFile
from collector.ledger import OPEN_ID_SLACK, Ledger
from topology.stages import frame_times
from inputs.plans import FramePlan, SourceItem


def _plan(total, open_ended=False):
    items = (SourceItem(kind="image", name="a.jpg", location="/x/a.jpg", frames=1),
             SourceItem(kind="image", name="b.jpg", location="/x/b.jpg", frames=1))
    return FramePlan(source="/x", items=items, lengths=(1, 1), total=None if open_ended else total)


def _result(frame_id, name, detections=2, saved=True, cold=False):
    return {"id": frame_id, "name": name, "t": {k: frame_id + i / 10 for i, k in enumerate(frame_times())},
            "workers": {"pre": "pre-0", "infer": f"infer-{frame_id % 2}", "post": "post-1"}, "batch": 1,
            "detections": [{}] * detections, "image_saved": saved, "cold": cold}


def test_frames_come_back_as_the_dicts_that_went_in():
    ledger = Ledger(_plan(4))
    sent = [_result(3, "b.jpg", 0, False, True), _result(0, "a.jpg"), _result(1, "b.jpg", 5)]
    for result in sent:
        assert ledger.add_result(result)
    frames = ledger.frames()
    assert [f["id"] for f in frames] == [0, 1, 3]
    by_id = {r["id"]: r for r in sent}
    for frame in frames:
        result = by_id[frame["id"]]
        assert frame["name"] == result["name"] and frame["workers"] == result["workers"]
        assert frame["t"] == pytest.approx(result["t"])
        assert frame["detections"] == len(result["detections"])
        assert (frame["image_saved"], frame["cold"], frame["batch"]) == (result["image_saved"], result["cold"], 1)


def test_a_name_other_than_the_plans_is_kept():
    ledger = Ledger(_plan(2))
    ledger.add_result(_result(0, "renamed.jpg"))
    assert ledger.frames()[0]["name"] == "renamed.jpg"


def test_duplicates_and_ids_outside_the_plan_are_counted_not_kept():
    ledger = Ledger(_plan(3))
    assert ledger.add_result(_result(1, "b.jpg"))
    assert not ledger.add_result(_result(1, "b.jpg"))
    assert not ledger.add_failure({"id": 1, "name": "b.jpg", "stage": "post", "worker": "post-0", "reason": "x"})
    assert not ledger.add_result(_result(3, "b.jpg")) and not ledger.add_result(_result(-1, "b.jpg"))
    assert (ledger.duplicates, ledger.out_of_plan, ledger.done()) == (2, 2, 1)
    assert ledger.reported_ids() == {1}


def test_an_open_ended_plan_grows_but_refuses_a_far_jump():
    ledger = Ledger(_plan(None, open_ended=True))
    assert ledger.add_result(_result(5000, "live:005000"))
    assert ledger.frames()[0]["name"] == "live:005000"
    assert not ledger.add_result(_result(5001 + 2 * OPEN_ID_SLACK, "live:far"))
    assert ledger.out_of_plan == 1 and ledger.reported_ids() == {5000}


def test_json_list_file_appears_whole_and_skips_what_is_not_json(tmp_path):
    path = tmp_path / "detections.json"
    out = JsonListFile(str(path), lambda r: json.dumps(r, allow_nan=False))
    out.extend([{"a": 1}, {"b": float("nan")}])
    out.extend([])
    out.extend([{"c": [1, 2]}])
    assert not path.exists(), "the target must not exist before finish()"
    assert out.finish()
    assert json.loads(path.read_text()) == [{"a": 1}, {"c": [1, 2]}]
    assert out.skipped == 1 and list(tmp_path.iterdir()) == [path]


def test_json_list_file_with_no_records_is_an_empty_list(tmp_path):
    out = JsonListFile(str(tmp_path / "p.json"), json.dumps)
    assert out.finish() and json.loads((tmp_path / "p.json").read_text()) == []


def test_json_list_file_on_a_full_disk_keeps_the_error_and_leaves_nothing(tmp_path):
    out = JsonListFile(str(tmp_path / "detections.json"), json.dumps)

    class FullDisk:
        def __init__(self, file):
            self.file = file

        def write(self, _text):
            raise OSError(errno.ENOSPC, "No space left on device")

        def close(self):
            self.file.close()
    out._file = FullDisk(out._file)
    out.extend([{"a": 1}])
    assert not out.finish()
    assert "No space left" in out.error and list(tmp_path.iterdir()) == []
