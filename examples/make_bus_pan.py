"""Make ``bus_pan.mp4``, the clip of the README's worked example: a 640x480, 24 fps camera pan
down Ultralytics' ``bus.jpg``, 72 frames.

    python examples/make_bus_pan.py ../shared/fixtures/bus.jpg bus_pan.mp4

The photo is scaled to the clip's width, then a window of the clip's height moves from its top
to its bottom in equal steps, one per frame (mp4v, as OpenCV writes it everywhere).
"""

from __future__ import annotations

import argparse
import sys

import cv2
import numpy as np


def pan_frames(image: np.ndarray, frames: int, width: int, height: int) -> list[np.ndarray]:
    """``frames`` views of ``height`` rows of ``image`` scaled to ``width``, top to bottom."""
    if frames < 2:
        raise ValueError(f"expected at least 2 frames, got {frames}")
    scaled_h = round(image.shape[0] * width / image.shape[1])
    if scaled_h < height:
        raise ValueError(f"expected a photo at least {height} rows tall at width {width}, got {scaled_h}")
    scaled = cv2.resize(image, (width, scaled_h), interpolation=cv2.INTER_AREA)
    tops = np.linspace(0, scaled_h - height, frames).round().astype(int)
    return [np.ascontiguousarray(scaled[top:top + height]) for top in tops]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("image", help="the photo to pan over (bus.jpg)")
    p.add_argument("out", help="the video to write (.mp4)")
    p.add_argument("--frames", type=int, default=72)
    p.add_argument("--fps", type=float, default=24.0)
    p.add_argument("--width", type=int, default=640)
    p.add_argument("--height", type=int, default=480)
    args = p.parse_args(argv)
    image = cv2.imread(args.image)
    if image is None:
        print(f"error: cannot read an image from {args.image!r}", file=sys.stderr)
        return 2
    writer = cv2.VideoWriter(args.out, cv2.VideoWriter_fourcc(*"mp4v"), args.fps, (args.width, args.height))
    if not writer.isOpened():
        print(f"error: OpenCV cannot write {args.out!r}", file=sys.stderr)
        return 2
    try:
        for frame in pan_frames(image, args.frames, args.width, args.height):
            writer.write(frame)
    finally:
        writer.release()
    print(f"{args.out}: {args.frames} frames of {args.width}x{args.height} at {args.fps:g} fps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
