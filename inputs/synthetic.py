"""Synthetic scenes: deterministic photo-like images for runs without a dataset."""

from __future__ import annotations

import cv2
import numpy as np

SYNTHETIC_SOURCE = "synthetic"  # the source of synthetic_count generated scenes
SYNTHETIC_SHAPES = ((480, 640), (720, 1280), (1080, 810), (375, 500), (1080, 1920), (640, 640))
SYNTHETIC_SHAPE_COUNT = 8
SYNTHETIC_NOISE_SCALE = 4  # background and grain are drawn at 1/4 size, then upscaled


def synthetic_image(index: int, seed: int = 0) -> np.ndarray:
    """A deterministic synthetic scene, BGR uint8 ``[H, W, 3]``; the shape cycles with ``index``
    over :data:`SYNTHETIC_SHAPES`.

    A smooth colour gradient with soft grain, then a handful of filled rectangles, ellipses
    and lines in random colours: flat regions and edges, roughly like a photo for JPEG and
    for the detector's preprocessing, at a cost of a few milliseconds.
    """
    if index < 0:
        raise ValueError(f"expected a synthetic index >= 0, got {index}")
    rng = np.random.default_rng((seed, index))
    height, width = SYNTHETIC_SHAPES[index % len(SYNTHETIC_SHAPES)]
    small = (width // SYNTHETIC_NOISE_SCALE + 1, height // SYNTHETIC_NOISE_SCALE + 1)  # (w, h)
    corners = rng.integers(0, 256, size=(3, 3, 3), dtype=np.uint8)
    background = cv2.resize(corners, small, interpolation=cv2.INTER_LINEAR)
    noise = rng.integers(0, 24, size=(small[1], small[0], 3), dtype=np.uint8)
    cv2.add(background, noise, dst=background)
    image = cv2.resize(background, (width, height), interpolation=cv2.INTER_LINEAR)
    size = min(height, width)
    for _ in range(SYNTHETIC_SHAPE_COUNT):
        shape = int(rng.integers(0, 3))
        colour = tuple(int(c) for c in rng.integers(0, 256, size=3))
        x, y = int(rng.integers(0, width)), int(rng.integers(0, height))
        extent = int(rng.integers(size // 20, size // 3))
        if shape == 0:
            corner = (x + int(rng.integers(-extent, extent)), y + int(rng.integers(-extent, extent)))
            cv2.rectangle(image, (x, y), corner, colour, thickness=-1)
        elif shape == 1:
            axes = (extent, int(rng.integers(size // 40 + 1, extent + 1)))
            cv2.ellipse(image, (x, y), axes, float(rng.integers(0, 180)), 0, 360, colour, thickness=-1)
        else:
            end = (int(rng.integers(0, width)), int(rng.integers(0, height)))
            cv2.line(image, (x, y), end, colour, thickness=int(rng.integers(1, 8)))
    return image
