"""From letterboxed uint8 images to the network's input tensor."""

from collections.abc import Sequence

import numpy as np
import torch

from yolo.letterbox import bgr_to_rgb_chw, check_bgr


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
