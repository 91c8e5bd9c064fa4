"""From letterboxed uint8 images to the network's input tensor."""

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
import torch

from yolo.letterbox import bgr_to_rgb_chw, check_bgr, letterbox_layout


def to_tensor(
    images: np.ndarray | Sequence[np.ndarray],
    device: torch.device | str,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Turn BGR ``uint8`` images into a normalised RGB network input batch.

    The channel flip and ``HWC -> CHW`` permute happen on the ``uint8`` tensor, which is copied
    to ``device`` before the conversion to ``dtype`` and the division by 255.

    Args:
        images (np.ndarray[H, W, 3] | np.ndarray[N, H, W, 3] | Sequence[np.ndarray[H, W, 3]]):
            ``uint8`` BGR image, batch, or list of same-shape images.
        device (torch.device | str): where the result lives.
        dtype (torch.dtype): floating dtype of the result.

    Returns:
        Tensor[N, 3, H, W]: contiguous RGB values in ``[0, 1]``.
    """
    if isinstance(images, np.ndarray):
        images = [images] if images.ndim == 3 else list(images)
    if len(images) == 0:
        raise ValueError("expected at least one image, got an empty sequence")
    shapes = {image.shape for image in images}
    if len(shapes) != 1:
        raise ValueError(f"expected images of one shape, got shapes {sorted(shapes)}")
    for image in images:
        check_bgr(image)
    batch = np.stack([bgr_to_rgb_chw(image) for image in images])
    return chw_batch_to_input(torch.from_numpy(batch), device, dtype)


def chw_batch_to_input(batch: torch.Tensor, device: torch.device | str,
                       dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Tensor[N, 3, H, W] uint8 RGB (on the host, pinned or not) -> the same in ``dtype`` scaled
    to [0, 1] on ``device``. The uint8 bytes cross to the device, a quarter of the float bytes."""
    if batch.dtype != torch.uint8 or batch.ndim != 4 or batch.shape[1] != 3:
        raise ValueError(f"expected a uint8 tensor of shape (N, 3, H, W), got {batch.dtype} {tuple(batch.shape)}")
    return batch.to(device, non_blocking=True).to(dtype).mul_(1 / 255)


MAX_PINNED_FRAME_SHAPES = 8  # letterboxed frame shapes with a pinned buffer; the least recently used goes


def batch_bucket(frames: int, batch_size: int) -> int:
    """The batch a GPU forward of ``frames`` frames runs at: the next power of two, or
    ``batch_size`` itself, whichever is smaller. A partial batch is padded up to it, so a process
    meets at most log2(batch_size) + 1 batch shapes per frame shape: each new input shape costs
    a one-off set-up (cuDNN plans, allocator pools) of tens of milliseconds, far more than the
    padded rows' compute on a GPU. Not used on the CPU, where every padded row is paid in full."""
    if not 1 <= frames <= batch_size:
        raise ValueError(f"expected 1 <= frames <= batch_size ({batch_size}), got {frames}")
    bucket = 1 << (frames - 1).bit_length()
    return min(bucket, batch_size)


MAX_WARM_FRAME_SHAPES = 16  # letterboxed shapes warmed before a run; a rarer one is met cold, and said so


def warm_input_shapes(frame_hws: Sequence[tuple[int, int]], imgsz: int, stride: int, rect: bool,
                      batch_size: int) -> list[tuple[int, int, int]]:
    """The ``(rows, h, w)`` batches a GPU run will meet for frames of these sizes: each
    letterboxed shape (the most common first, at most MAX_WARM_FRAME_SHAPES) at every batch
    bucket (:func:`batch_bucket`), so their one-off set-up runs before the measured window."""
    counts: dict[tuple[int, int], int] = {}
    for hw in frame_hws:
        shape = letterbox_layout(hw, imgsz, stride, rect)[0].shape
        counts[shape] = counts.get(shape, 0) + 1
    shapes = sorted(counts, key=lambda s: -counts[s])[:MAX_WARM_FRAME_SHAPES]
    buckets = sorted({batch_bucket(n, batch_size) for n in range(1, batch_size + 1)})
    return [(rows, h, w) for h, w in shapes for rows in buckets]


class BatchInput:
    """Turns uint8 3xHxW RGB frames into the model's float batch on ``device``.

    On CUDA the frames are stacked into a pinned host buffer that holds ``capacity`` frames of
    their shape, made once per frame shape and reused for every batch of that shape (page-locking
    costs milliseconds and freeing it waits for the device: never per batch), then copied
    without blocking. ``rows`` > len(frames) pads the batch with the buffer's stale rows, whose
    results the caller drops."""

    def __init__(self, device: torch.device, dtype: torch.dtype, capacity: int):
        self.device, self.dtype, self.capacity = torch.device(device), dtype, capacity
        self.pinned: OrderedDict[tuple, torch.Tensor] = OrderedDict()

    def __call__(self, images: list[np.ndarray], rows: int | None = None) -> torch.Tensor:
        rows = len(images) if rows is None else rows
        if not len(images) <= rows <= self.capacity:
            raise ValueError(f"expected {len(images)} <= rows <= {self.capacity}, got {rows}")
        if self.device.type != "cuda":
            padded = list(images) + [images[-1]] * (rows - len(images))
            return chw_batch_to_input(torch.from_numpy(np.stack(padded)), self.device, self.dtype)
        host = self._pinned(images[0].shape)  # safe to refill: the last batch's copy finished at its sync
        np.stack(images, out=host[:len(images)].numpy())
        return chw_batch_to_input(host[:rows], self.device, self.dtype)

    def _pinned(self, frame_shape: tuple) -> torch.Tensor:
        if frame_shape in self.pinned:
            self.pinned.move_to_end(frame_shape)
            return self.pinned[frame_shape]
        if len(self.pinned) >= MAX_PINNED_FRAME_SHAPES:
            self.pinned.popitem(last=False)
        buffer = torch.empty((self.capacity, *frame_shape), dtype=torch.uint8).pin_memory()
        self.pinned[frame_shape] = buffer
        return buffer
