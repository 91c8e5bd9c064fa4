"""An S3-compatible server on 127.0.0.1 for the object-store tests: moto's server mode on a free
port, a bucket of small images, and the environment that points boto at it (dummy credentials,
AWS_ENDPOINT_URL). Nothing leaves this machine; the server stops with the fixture."""

from __future__ import annotations

import contextlib
import logging
import urllib.request

import cv2
import numpy as np
import pytest

BUCKET = "frames"
DUMMY_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                     "AWS_DEFAULT_REGION": "us-east-1"}
NO_PROXY = {"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}


def jpeg(seed: int, shape=(48, 64)) -> bytes:
    """A small noisy JPEG, different for each seed."""
    image = np.random.default_rng(seed).integers(0, 255, (*shape, 3), dtype=np.uint8)
    ok, data = cv2.imencode(".jpg", image)
    assert ok
    return data.tobytes()


@contextlib.contextmanager
def s3_server(monkeypatch=None, host: str = "127.0.0.1"):
    """``(endpoint, env)``: a moto server on a free port of ``host`` (an address of this machine)
    and the variables a process needs to reach it; with ``monkeypatch``, this process's
    environment is set too."""
    server_mod = pytest.importorskip("moto.server", reason="moto[server] is not installed (requirements-dev.txt)")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line a request otherwise
    server = server_mod.ThreadedMotoServer(ip_address=host, port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        env = {**DUMMY_CREDENTIALS, **NO_PROXY, "AWS_ENDPOINT_URL": f"http://{host}:{port}"}
        if monkeypatch is not None:
            for key, value in env.items():
                monkeypatch.setenv(key, value)
        yield env["AWS_ENDPOINT_URL"], env
    finally:
        _reset(server)
        server.stop()
        _forget_clients()


def _reset(server) -> None:
    """Empty the server's store: moto keeps its buckets per process, and the next server this
    process starts would list this one's objects."""
    host, port = server.get_host_and_port()
    request = urllib.request.Request(f"http://{host}:{port}/moto-api/reset", method="POST")
    with contextlib.suppress(OSError), urllib.request.urlopen(request, timeout=10):
        pass


def _forget_clients() -> None:
    """fsspec keeps a file system per set of options in each process: the next server's port
    differs, so the instances made for this one go."""
    with contextlib.suppress(ImportError):
        from s3fs import S3FileSystem
        S3FileSystem.clear_instance_cache()


def fill_bucket(objects: dict[str, bytes]) -> None:
    """Make the bucket and put ``objects`` (key -> bytes) in it, through fsspec as the runs read."""
    import fsspec
    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)
    for key, data in objects.items():
        fs.pipe_file(f"{BUCKET}/{key}", data)
