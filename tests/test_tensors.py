"""yolo.tensors: the batch buckets a GPU runs partial batches at, and the pinned staging
buffers, which must be made once per frame shape, never per batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import yolo.tensors as tensors
from yolo.tensors import BatchInput, batch_bucket


@pytest.mark.parametrize("frames, batch_size, bucket", [
    (1, 1, 1), (1, 32, 1), (2, 32, 2), (3, 32, 4), (5, 8, 8), (8, 8, 8), (9, 32, 16), (17, 32, 32),
    (32, 32, 32), (9, 12, 12), (5, 12, 8), (7, 7, 7),
])
def test_batch_bucket(frames, batch_size, bucket):
    assert batch_bucket(frames, batch_size) == bucket


def test_buckets_keep_the_input_shapes_few():
    # Batches of 1..32 frames would be 32 input shapes, each a one-off set-up on the GPU.
    assert sorted({batch_bucket(n, 32) for n in range(1, 33)}) == [1, 2, 4, 8, 16, 32]


@pytest.mark.parametrize("frames", [0, 9])
def test_batch_bucket_refuses_counts_outside_the_batch(frames):
    with pytest.raises(ValueError, match=f"got {frames}"):
        batch_bucket(frames, 8)


def _frames(n: int, h: int = 8, w: int = 16) -> list[np.ndarray]:
    return [np.full((3, h, w), i, np.uint8) for i in range(n)]


def test_cpu_batches_are_the_frames_scaled_and_padded_with_the_last():
    batch = BatchInput(torch.device("cpu"), torch.float32, capacity=4)(_frames(3), rows=4)
    assert batch.shape == (4, 3, 8, 16) and batch.dtype == torch.float32
    assert [round(float(batch[i].max()) * 255) for i in range(4)] == [0, 1, 2, 2]


def test_rows_beyond_the_capacity_are_refused():
    with pytest.raises(ValueError, match="rows <= 4, got 5"):
        BatchInput(torch.device("cpu"), torch.float32, capacity=4)(_frames(2), rows=5)


def test_cuda_staging_pins_one_buffer_per_frame_shape_whatever_the_batch(monkeypatch):
    # A pinned buffer per batch shape (as before) re-pinned memory on nearly every partial batch
    # on the GPU: page-locking costs milliseconds and freeing it waits for the device.
    pinned = []

    def pin(tensor):
        pinned.append(tuple(tensor.shape))
        return tensor

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin)
    monkeypatch.setattr(tensors, "chw_batch_to_input", lambda host, device, dtype: host)  # no GPU here
    stage = BatchInput(torch.device("cuda"), torch.float16, capacity=32)
    for n in list(range(1, 33)) * 2:
        rows = batch_bucket(n, 32)
        host = stage(_frames(n), rows)
        assert host.shape == (rows, 3, 8, 16)
        assert [int(host[i, 0, 0, 0]) for i in range(n)] == list(range(n))
    stage(_frames(3, h=16, w=8), 4)
    assert pinned == [(32, 3, 8, 16), (32, 3, 16, 8)]
