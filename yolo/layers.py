"""The YOLOv5 (v6+) layers in dependency order, the Detect head last: named and shaped as
Ultralytics' are, so their checkpoints' weights load by name (yolo/model.py builds the model)."""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn as nn
from torch.nn.utils.fusion import fuse_conv_bn_eval

from yolo.timing import timed

BN_EPS = 1e-3
BN_MOMENTUM = 0.03


def autopad(kernel: int, padding: int | None = None) -> int:
    """'same' padding for odd kernels, as YOLOv5 uses it."""
    return kernel // 2 if padding is None else padding


class Conv(nn.Module):
    """Conv2d (no bias) + BatchNorm2d + SiLU; after ``fuse()`` the BN is folded into the conv."""

    def __init__(self, c1: int, c2: int, k: int = 1, s: int = 1, p: int | None = None,
                 g: int = 1, act: bool = True):
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, autopad(k, p), groups=g, bias=False)
        self.bn: nn.BatchNorm2d | None = nn.BatchNorm2d(c2, eps=BN_EPS, momentum=BN_MOMENTUM)
        self.act = nn.SiLU() if act else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        if self.bn is not None:
            x = self.bn(x)
        return self.act(x)

    def fuse(self) -> None:
        if self.bn is not None:
            self.conv = fuse_conv_bn_eval(self.conv, self.bn)
            self.bn = None


class Bottleneck(nn.Module):
    def __init__(self, c1: int, c2: int, shortcut: bool = True, g: int = 1, e: float = 0.5):
        super().__init__()
        c_ = int(c2 * e)
        self.cv1 = Conv(c1, c_, 1, 1)
        self.cv2 = Conv(c_, c2, 3, 1, g=g)
        self.add = shortcut and c1 == c2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C3(nn.Module):
    """CSP bottleneck with three convolutions."""

    def __init__(self, c1: int, c2: int, n: int = 1, shortcut: bool = True, g: int = 1,
                 e: float = 0.5):
        super().__init__()
        c_ = int(c2 * e)
        self.cv1 = Conv(c1, c_, 1, 1)
        self.cv2 = Conv(c1, c_, 1, 1)
        self.cv3 = Conv(2 * c_, c2, 1)
        self.m = nn.Sequential(*(Bottleneck(c_, c_, shortcut, g, e=1.0) for _ in range(n)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv3(torch.cat((self.m(self.cv1(x)), self.cv2(x)), 1))


class SPPF(nn.Module):
    """Spatial pyramid pooling, fast: three chained max-pools instead of three parallel ones."""

    def __init__(self, c1: int, c2: int, k: int = 5):
        super().__init__()
        c_ = c1 // 2
        self.cv1 = Conv(c1, c_, 1, 1)
        self.cv2 = Conv(c_ * 4, c2, 1, 1)
        self.m = nn.MaxPool2d(kernel_size=k, stride=1, padding=k // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.cv1(x)
        y1 = self.m(x)
        y2 = self.m(y1)
        return self.cv2(torch.cat((x, y1, y2, self.m(y2)), 1))


class Concat(nn.Module):
    def __init__(self, dimension: int = 1):
        super().__init__()
        self.d = dimension

    def forward(self, xs: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(xs, self.d)


@timed("Detect.decode")
def decode_inplace(maps: list[torch.Tensor], grids: list[torch.Tensor], anchors: list[torch.Tensor],
                   strides: list[float]) -> torch.Tensor:
    """Decode raw head maps into boxes, writing xywh into the sigmoid output.

    Args:
        maps: per level Tensor[B, na, no, ny, nx], raw conv outputs (channel-first).
        grids: per level Tensor[1, na, 2, ny, nx], (cell - 0.5) * stride.
        anchors: per level Tensor[1, na, 2, 1, 1], 4 * anchor size in pixels.
        strides: per level stride in pixels.

    Returns:
        Tensor[B, N, no]: (cx, cy, w, h, objectness, class probs...) in input pixels,
        N = sum of na * ny * nx over levels, level-major then anchor, row, column.
    """
    pieces = []
    for raw, grid, anchor, stride in zip(maps, grids, anchors, strides):
        y = raw.sigmoid()
        y[:, :, 0:2].mul_(2 * stride).add_(grid)  # xy = (2 * sig - 0.5 + cell) * stride
        y[:, :, 2:4].square_().mul_(anchor)  # wh = (2 * sig) ** 2 * anchor
        pieces.extend(_rows_per_anchor(y))
    return torch.cat(pieces, 1)


@timed("Detect.decode")
def decode_outplace(maps: list[torch.Tensor], grids: list[torch.Tensor], anchors: list[torch.Tensor],
                    strides: list[float]) -> torch.Tensor:
    """Same result as ``decode_inplace`` without in-place ops or slice assignment (exportable).

    Each (level, anchor) block is assembled in the output's row layout, so the only extra work
    over the in-place path is one copy of the confidence columns, whatever the maps' layout."""
    pieces = []
    for raw, grid, anchor, stride in zip(maps, grids, anchors, strides):
        rows = _rows_per_anchor(raw.sigmoid())
        grid_rows = _rows_per_anchor(grid)
        for a, y in enumerate(rows):
            xy = y[..., 0:2] * (2 * stride) + grid_rows[a]
            wh = y[..., 2:4].square() * anchor[:, a].view(1, 1, 2)
            pieces.append(torch.cat((xy, wh, y[..., 4:]), -1))
    return torch.cat(pieces, 1)


def _rows_per_anchor(y: torch.Tensor) -> list[torch.Tensor]:
    # [B, na, no, ny, nx] -> na views of [B, ny*nx, no]; the final torch.cat does the transpose
    # copy, so no separate permute().contiguous() pass is needed.
    b, na, no = y.shape[:3]
    return [y[:, a].reshape(b, no, -1).transpose(1, 2) for a in range(na)]


class Detect(nn.Module):
    """Detection head: a 1x1 conv per level, then sigmoid decoding into boxes in input pixels."""

    def __init__(self, nc: int = 80, anchors: Sequence[Sequence[float]] = (), ch: Sequence[int] = (),
                 inplace: bool = True):
        super().__init__()
        self.nc = nc
        self.no = nc + 5
        self.nl = len(anchors)
        self.na = len(anchors[0]) // 2
        self.inplace = inplace
        # Anchors are kept in grid units (pixels / stride) like Ultralytics, so weights load as is.
        self.register_buffer("anchors", torch.tensor(anchors, dtype=torch.float32).view(self.nl, -1, 2))
        self.register_buffer("stride", torch.ones(self.nl), persistent=False)
        self.m = nn.ModuleList(nn.Conv2d(c, self.no * self.na, 1) for c in ch)
        self._grid_cache: dict[tuple, tuple[list[torch.Tensor], list[torch.Tensor], list[float]]] = {}
        self.evict_grids = True  # False while CUDA graphs replay forwards that read these grids' memory

    def forward(self, xs: list[torch.Tensor]) -> torch.Tensor | list[torch.Tensor]:
        maps = []
        for i, conv in enumerate(self.m):
            # Decode in fp32 whatever the model's precision: bf16 keeps 8 bits of mantissa, so
            # box coordinates near 640 would come in steps of 4 pixels (fp16: half a pixel).
            x = conv(xs[i]).float()
            b, _, ny, nx = x.shape
            maps.append(x.view(b, self.na, self.no, ny, nx))  # [B, na, no, ny, nx]
        if self.training:
            return maps
        decode = decode_inplace if self.inplace else decode_outplace
        with torch.autocast(maps[0].device.type, enabled=False):
            return decode(maps, *self._grids(maps))

    def _grids(self, maps: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor], list[float]]:
        key = tuple(m.shape[-2:] for m in maps) + (maps[0].device, maps[0].dtype)
        if key not in self._grid_cache:
            if len(self._grid_cache) > 32 and self.evict_grids:  # many rect shapes: keep memory bounded
                self._grid_cache.clear()
            self._grid_cache[key] = self._make_grids(maps)
        return self._grid_cache[key]

    def _make_grids(self, maps):
        # Built once per input shape; strides become Python floats so forward never syncs a GPU.
        grids, anchors, strides = [], [], [float(s) for s in self.stride.tolist()]
        for i, m in enumerate(maps):
            ny, nx = m.shape[-2:]
            stride = strides[i]
            yv, xv = torch.meshgrid(torch.arange(ny, device=m.device), torch.arange(nx, device=m.device),
                                    indexing="ij")
            xy = torch.stack((xv, yv), 0).to(m.dtype)  # [2, ny, nx]
            grids.append(((xy - 0.5) * stride).expand(1, self.na, 2, ny, nx).contiguous())
            wh = self.anchors[i].to(m.device, torch.float32) * stride * 4  # [na, 2], (2*sig)^2 = 4*sig^2
            anchors.append(wh.to(m.dtype).view(1, self.na, 2, 1, 1))
        return grids, anchors, strides

    def _apply(self, fn, recurse=True):
        self._grid_cache = {}  # device or dtype changed: cached grids are stale
        return super()._apply(fn, recurse)
