"""Shared test fixtures: the read-only fixture folder next to the repository, the real
YOLOv5n checkpoint loaded (fused) once per session, ZeroMQ contexts whose sockets are closed
before they end, and live runs of the runner that are ended after each test."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURES_DIR = REPO_ROOT.parent / "shared" / "fixtures"


def fixture_path(name: str) -> Path:
    """The path of one fixture file; skips the calling test when it is absent."""
    path = FIXTURES_DIR / name
    if not path.is_file():
        pytest.skip(f"../shared/fixtures not found: {path} is missing")
    return path


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    if not FIXTURES_DIR.is_dir():
        pytest.skip(f"../shared/fixtures not found: expected the folder {FIXTURES_DIR}")
    return FIXTURES_DIR


@pytest.fixture(scope="session")
def yolov5n_path(fixtures_dir: Path) -> Path:
    return fixture_path("yolov5n.pt")


@pytest.fixture(scope="session")
def yolov5n(yolov5n_path: Path):
    """The real YOLOv5n checkpoint as an eval-mode, fused, in-place-decode CPU model. Shared:
    tests must not modify it (use ``copy.deepcopy`` first)."""
    from yolo.checkpoint import load_model

    return load_model(yolov5n_path)


@pytest.fixture
def ctx():
    import zmq

    context = zmq.Context()
    yield context
    context.term()


@pytest.fixture
def made(ctx):
    """Links and sockets a test makes, closed at the end so ``ctx.term()`` never hangs."""
    items = []
    yield items
    for item in items:
        item.close()


@pytest.fixture
def live(tmp_path):
    """start_run(...) for the test; whatever the test leaves running is ended afterwards."""
    from tests.live_run import start_run

    runs = []

    def start(*flags, **options):
        run = start_run(tmp_path, *flags, **options)
        runs.append(run)
        return run

    yield start
    for run in runs:
        run.close()
