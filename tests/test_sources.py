import os

import cv2
import pytest

from tests.media import MediaServer, tiny_image, write_video
from inputs.frames import FrameRef
from inputs.plans import FramePlan, SourceItem
from inputs.sources import plan_frames
from inputs.streams import StreamOptions

VIDEO_FRAMES = 12
QUICK = StreamOptions(open_timeout_ms=2000, read_timeout_ms=2000, reconnect_attempts=1, reconnect_backoff_s=0.01)


@pytest.fixture
def image_tree(tmp_path):
    """root/{b.png, a.jpg, nested/c.PNG, nested/deeper/d.bmp, empty/}"""
    root = tmp_path / "images"
    (root / "nested" / "deeper").mkdir(parents=True)
    (root / "empty").mkdir()
    files = {"b.png": 20, "a.jpg": 10, "nested/c.PNG": 30, "nested/deeper/d.bmp": 40}
    for relpath, value in files.items():
        assert cv2.imwrite(str(root / relpath), tiny_image(value))
    return root


@pytest.fixture
def mixed_tree(image_tree):
    """image_tree plus a video, a broken symlink, a .txt, a file without extension, and hidden entries."""
    write_video(image_tree / "nested" / "clip.avi", VIDEO_FRAMES)
    os.symlink(image_tree / "gone.jpg", image_tree / "link.jpg")
    (image_tree / "notes.txt").write_text("not an image")
    (image_tree / "README").write_text("no extension")
    (image_tree / ".DS_Store").write_bytes(b"\0")
    (image_tree / ".git").mkdir()
    (image_tree / ".git" / "x.jpg").write_bytes(b"\0")
    return image_tree


def names(plan: FramePlan) -> list[str]:
    return [item.name for item in plan.items]


def test_directory_sorted_recursive_case_insensitive(image_tree):
    plan = plan_frames(str(image_tree))
    assert plan.root == str(image_tree)
    assert plan.total == plan.pass_len == 4
    assert names(plan) == ["a.jpg", "b.png", "nested/c.PNG", "nested/deeper/d.bmp"]
    assert {item.kind for item in plan.items} == {"image"}
    assert all(os.path.isabs(item.location) for item in plan.items)
    assert plan.ref(2) == FrameRef(2, "image", "nested/c.PNG", 2, 0, 0, str(image_tree / "nested" / "c.PNG"), 0)


def test_directory_entries_are_never_skipped_silently(mixed_tree):
    """Files that are not images or videos are left out and counted, as detect.py leaves them
    out; a media file that cannot be read is still a failed frame."""
    plan = plan_frames(str(mixed_tree))
    by_name = {item.name: item for item in plan.items}
    assert names(plan) == sorted(by_name)
    assert by_name["nested/clip.avi"].kind == "video" and by_name["nested/clip.avi"].frames == VIDEO_FRAMES
    assert by_name["link.jpg"].kind == "broken"
    assert by_name["link.jpg"].reason == f"broken symlink -> {mixed_tree / 'gone.jpg'}"
    assert "notes.txt" not in by_name and "README" not in by_name
    assert not any(name.startswith(".") or "/." in name for name in by_name)
    assert plan.skipped == ("2 hidden entries (names starting with '.') under .",
                            "2 files that are not images or videos (1 (no extension), 1 .txt) under .")
    assert plan.skipped_files == 2
    assert plan.total == 4 + VIDEO_FRAMES + 1  # the broken symlink is one planned (failing) frame
    assert "hidden" in plan.summary() and "1 broken" in plan.summary()


def test_a_yolo_dataset_folder_reads_its_images_only(tmp_path):
    """A YOLO dataset root (images/, labels/*.txt, data.yaml) as --source: its images are the
    frames, everything else is left out and counted; an image that does not decode still fails."""
    for split in ("train", "val"):
        (tmp_path / "images" / split).mkdir(parents=True)
        (tmp_path / "labels" / split).mkdir(parents=True)
        for i in range(3):
            cv2.imwrite(str(tmp_path / "images" / split / f"{i}.jpg"), tiny_image(10 * i))
            (tmp_path / "labels" / split / f"{i}.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    (tmp_path / "images" / "val" / "bad.jpg").write_text("not a jpeg")
    (tmp_path / "data.yaml").write_text("names: [thing]\n")
    plan = plan_frames(str(tmp_path))
    assert plan.total == 7 and {item.kind for item in plan.items} == {"image"}  # bad.jpg fails when it is read
    assert plan.skipped_files == 7 and "7 files that are not images or videos (6 .txt, 1 .yaml)" in plan.summary()


def test_directory_symlink_followed_once(image_tree):
    os.symlink(image_tree / "nested", image_tree / "again")
    os.symlink(image_tree, image_tree / "nested" / "loop")
    plan = plan_frames(str(image_tree))
    assert names(plan) == ["a.jpg", "b.png", "nested/c.PNG", "nested/deeper/d.bmp"]  # real folders first
    assert plan.skipped == (f"again: a directory listed already ({image_tree / 'nested'})",
                            f"nested/loop: a directory listed already ({image_tree})")


def test_special_and_unreadable_files(image_tree):
    os.mkfifo(image_tree / "pipe.jpg")
    by_name = {item.name: item for item in plan_frames(str(image_tree)).items}
    assert by_name["pipe.jpg"].reason == "not a regular file"
    if os.geteuid() == 0:
        pytest.skip("root reads files without read permission")
    (image_tree / "a.jpg").chmod(0)
    by_name = {item.name: item for item in plan_frames(str(image_tree)).items}
    assert by_name["a.jpg"].reason == "unreadable file (permission denied)"


def test_single_files(image_tree, tmp_path):
    plan = plan_frames(str(image_tree / "nested" / "c.PNG"))
    assert (plan.total, names(plan), plan.root) == (1, ["c.PNG"], str(image_tree / "nested"))
    video = write_video(tmp_path / "clip.mp4", VIDEO_FRAMES)
    plan = plan_frames(str(video))
    item = plan.items[0]
    assert (item.kind, item.frames, plan.total) == ("video", VIDEO_FRAMES, VIDEO_FRAMES)
    assert (item.video.width, item.video.height, item.video.fps, item.video.frames) == (64, 48, 10.0, VIDEO_FRAMES)
    assert plan.ref(3).name == "clip.mp4:000004" and plan.ref(3).source_index == 3  # named from 1


def test_unicode_path(tmp_path):
    folder = tmp_path / "bilder-ü"
    folder.mkdir()
    ok, encoded = cv2.imencode(".png", tiny_image(77))
    assert ok
    encoded.tofile(str(folder / "straße.png"))
    assert names(plan_frames(str(folder))) == ["straße.png"]


def test_glob(image_tree):
    plan = plan_frames(str(image_tree / "**" / "*.png"))
    assert plan.root == str(image_tree)
    assert names(plan) == ["b.png"]
    plan = plan_frames(str(image_tree / "nested" / "*"))  # the directory 'deeper' is not a match
    assert plan.root == str(image_tree / "nested")
    assert names(plan) == ["c.PNG"]
    assert names(plan_frames(str(image_tree / "*" / "*"))) == ["nested/c.PNG"]
    (image_tree / "notes.txt").write_text("x")
    assert plan_frames(str(image_tree / "*.txt")).items[0].kind == "broken"


def test_synthetic():
    plan = plan_frames("synthetic", synthetic_count=10)
    assert (plan.total, plan.root, len(plan.items)) == (10, "", 10)
    assert plan.ref(7) == FrameRef(7, "synthetic", "synthetic/00007.jpg", 7, 0, 0, "", 7)


def test_looping(image_tree):
    plan = plan_frames(str(image_tree), frames=10)
    assert (plan.total, plan.pass_len) == (10, 4)
    refs = [plan.ref(i) for i in range(10)]
    assert [r.item for r in refs] == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    assert [r.cycle for r in refs] == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2]
    assert refs[5].name == refs[1].name == "b.png"
    assert plan_frames(str(image_tree), frames=2).total == 2
    synthetic = plan_frames("synthetic", frames=5, synthetic_count=2)
    assert synthetic.ref(4).name == "synthetic/00000.jpg" and synthetic.ref(4).cycle == 2


def test_ref_out_of_range(image_tree):
    plan = plan_frames(str(image_tree), frames=6)
    with pytest.raises(IndexError, match=r"\[0, 6\).*got 6"):
        plan.ref(6)
    with pytest.raises(IndexError, match="got -1"):
        plan.ref(-1)


def test_vid_stride(tmp_path):
    video = write_video(tmp_path / "clip.avi", VIDEO_FRAMES)
    plan = plan_frames(str(video), vid_stride=5)
    assert plan.total == 3  # frames 0, 5, 10
    assert [plan.ref(i).source_index for i in range(3)] == [0, 5, 10]
    assert [plan.ref(i).index for i in range(3)] == [0, 1, 2]
    assert plan.ref(2).name == "clip.avi:000011"
    assert plan.items[0].video.fps == 2.0 and plan.items[0].video.source_fps == 10.0
    assert plan_frames(str(video), vid_stride=VIDEO_FRAMES).total == 1
    with pytest.raises(ValueError, match="vid_stride"):
        plan_frames(str(video), vid_stride=0)


def test_list_file(image_tree, tmp_path):
    clip = write_video(tmp_path / "clip.avi", VIDEO_FRAMES)
    with MediaServer({"clip.avi": clip.read_bytes()}) as server:
        listing = image_tree / "list.txt"
        listing.write_text("\n".join([
            "# a comment, then a blank line", "",
            "  a.jpg  ",  # relative to the list's folder
            str(image_tree / "nested" / "c.PNG"),
            "nested/deeper",  # a directory
            "*.png",  # a glob
            "missing.jpg",
            server.url("/files/clip.avi"),  # http with a frame count: a video
            server.url("/live.mjpg"),  # http without one: a live stream
            server.url("/files/missing.avi"),
            "rtsp://user:secret@cam.local:554/ch1",  # not opened while planning
            "1",  # a camera
        ]))
        plan = plan_frames(str(listing), streams=QUICK)
    kinds = [(item.kind, item.name) for item in plan.items]
    host = server.url("").split("//")[1].replace(":", "_")
    assert kinds == [
        ("image", "a.jpg"), ("image", "nested/c.PNG"), ("image", "nested/deeper/d.bmp"), ("image", "b.png"),
        ("broken", "missing.jpg"), ("video", f"{host}/files/clip.avi"), ("stream", f"{host}/live.mjpg"),
        ("broken", f"{host}/files/missing.avi"), ("stream", "cam.local_554/ch1"), ("stream", "camera1"),
    ]
    assert plan.items[4].reason == "no such file or directory"
    assert plan.items[5].frames == VIDEO_FRAMES
    assert plan.items[7].reason.startswith("cannot open URL")
    assert plan.items[8].location == "rtsp://user:secret@cam.local:554/ch1"
    assert plan.open_ended and plan.total is None and plan.pass_len == 4 + 1 + VIDEO_FRAMES + 1


def test_list_names_stay_inside_output_folders(tmp_path):
    outside = tmp_path / "outside.png"
    assert cv2.imwrite(str(outside), tiny_image(1))
    (tmp_path / "lists").mkdir()
    listing = tmp_path / "lists" / "l.txt"
    listing.write_text("../outside.png\n")
    assert names(plan_frames(str(listing))) == [str(outside).lstrip("/")]


def test_camera_and_rtsp_sources_plan_without_opening():
    plan = plan_frames("0")
    assert plan.items == (SourceItem("stream", "0", "camera0", None),)
    assert plan.open_ended and plan.pass_len == 0
    plan = plan_frames("rtsp://cam.local/ch1", frames=50)
    assert (plan.total, plan.lengths) == (50, (50,))
    assert plan.ref(49).name == "cam.local/ch1:000050" and plan.ref(49).kind == "stream"


def test_live_streams_share_frames(image_tree):
    listing = image_tree / "l.txt"
    listing.write_text("a.jpg\n0\nb.png\n1\n2\n")
    plan = plan_frames(str(listing), frames=10)
    assert plan.lengths == (1, 3, 1, 3, 2)  # 8 live frames, split in stream order
    truncated = plan_frames(str(listing), frames=1)
    assert (truncated.total, truncated.lengths) == (1, (1, 0, 1, 0, 0))  # only a.jpg is read: no live frame


def test_bad_sources(tmp_path, image_tree):
    with pytest.raises(ValueError, match="nonexistent path .*missing"):
        plan_frames(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="directory .*empty.* got none"):
        plan_frames(str(image_tree / "empty"))
    (image_tree / "empty" / ".hidden.jpg").write_bytes(b"")
    with pytest.raises(ValueError, match="got none .*1 hidden entries"):
        plan_frames(str(image_tree / "empty"))
    with pytest.raises(ValueError, match=r"glob .*\*\.gif.* got none"):
        plan_frames(str(image_tree / "*.gif"))
    (image_tree / "data.csv").write_text("x")
    with pytest.raises(ValueError, match="extension '.csv'"):
        plan_frames(str(image_tree / "data.csv"))
    (image_tree / "broken.mp4").write_bytes(b"not a video at all")
    with pytest.raises(ValueError, match="broken.mp4.*cannot open video"):
        plan_frames(str(image_tree / "broken.mp4"))
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    with pytest.raises(ValueError, match="broken symlink"):
        plan_frames(str(tmp_path / "dangling"))
    (tmp_path / "empty.txt").write_text("# nothing\n\n")
    with pytest.raises(ValueError, match="list file .* got none"):
        plan_frames(str(tmp_path / "empty.txt"))
    with pytest.raises(ValueError, match="URL OpenCV can open"):
        plan_frames("http://127.0.0.1:9/clip.mp4", streams=QUICK)
    for frames in (0, -3, 1.5, True):
        with pytest.raises(ValueError, match="expected frames"):
            plan_frames(str(image_tree), frames=frames)
    with pytest.raises(ValueError, match="synthetic_count"):
        plan_frames("synthetic", synthetic_count=0)
