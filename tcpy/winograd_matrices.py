"""Winograd's minimal filtering F(m, 3) as data: the transform matrices of a tile size, made from
its interpolation points (Toom-Cook), from which the winograd path's C is generated.

For ``m`` outputs per tile and axis, a window of 3 taps and ``a = m + 2`` points (``a - 1``
finite ones and infinity), a correlation ``y(i) = sum_k d(i + k) g(k)`` is
``y = A^T [(G g) . (B^T d)]`` (the transpose of the Toom-Cook convolution): with
``M(x) = prod_j (x - p_j)`` over the finite points and ``M_j(x) = M(x) / (x - p_j)``,

- ``B^T`` row ``j``: the coefficients of ``M_j``, the last row those of ``M`` (the point at infinity);
- ``G`` row ``j``: ``(1, p_j, p_j^2) / M_j(p_j)``, the last row ``(0, 0, 1)``;
- ``A^T`` column ``j``: ``(1, p_j, ..., p_j^(m-1))``, the last column ``(0, ..., 0, 1)``.

A row's sign is chosen so that its ``G`` scale is positive (negating a row of ``B^T`` and ``G``
together changes no product). In two dimensions ``Y = A^T [(G g G^T) . (B^T d B)] A``. The points
0, 1, -1 give F(2x2, 3x3) (Lavin and Gray's matrices); 0, +-1, +-2 give F(4x4, 3x3), whose
constants (up to 8 and 1/24 against 1 and 1/2) make float32 rounding grow.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from fractions import Fraction

TAPS = 3  # the window (tcpy.contraction_ir.TAPS)
#: The finite interpolation points of each tile size (infinity is the last point of every one).
TILE_POINTS: dict[int, tuple[int, ...]] = {2: (0, 1, -1), 4: (0, 1, -1, 2, -2)}

Matrix = tuple[tuple[Fraction, ...], ...]


@dataclass(frozen=True)
class Transforms:
    """The matrices of F(tile x tile, 3x3): ``bt`` (a x a), ``g`` (a x 3), ``at`` (tile x a)."""

    tile: int
    bt: Matrix
    g: Matrix
    at: Matrix

    @property
    def size(self) -> int:
        """``a``: the input patch's side (tile + taps - 1), the points per axis."""
        return self.tile + TAPS - 1


def _poly_times_linear(coefs: list[Fraction], root: Fraction) -> list[Fraction]:
    """The coefficients (lowest first) of ``poly(x) * (x - root)``."""
    out = [Fraction(0)] * (len(coefs) + 1)
    for i, c in enumerate(coefs):
        out[i + 1] += c
        out[i] -= c * root
    return out


def _product(roots) -> list[Fraction]:
    poly = [Fraction(1)]
    for r in roots:
        poly = _poly_times_linear(poly, Fraction(r))
    return poly


@functools.cache
def transforms(tile: int) -> Transforms:
    """The transform matrices of F(tile x tile, 3x3) from :data:`TILE_POINTS` (exact fractions)."""
    points = [Fraction(p) for p in TILE_POINTS[tile]]
    a = tile + TAPS - 1
    bt, g = [], []
    for j, p in enumerate(points):
        others = [q for i, q in enumerate(points) if i != j]
        scale = Fraction(1)
        for q in others:
            scale *= p - q
        sign = 1 if scale > 0 else -1
        bt.append(tuple(sign * c for c in _product(others) + [Fraction(0)]))
        g.append(tuple(sign * p ** k / scale for k in range(TAPS)))
    bt.append(tuple(_product(points)))
    g.append(tuple(Fraction(int(k == TAPS - 1)) for k in range(TAPS)))
    at = tuple(tuple([p ** i for p in points] + [Fraction(int(i == tile - 1))]) for i in range(tile))
    assert all(len(row) == a for row in bt) and len(bt) == a
    return Transforms(tile, tuple(bt), tuple(g), at)


def _nonzeros(matrix: Matrix) -> int:
    return sum(1 for row in matrix for c in row if c)


@functools.cache
def operation_counts(tile: int) -> tuple[int, int, int]:
    """Operations (loads, stores, one per term of each transform's sums) of the input transform
    per tile and input channel, the output transform per tile and output channel, and the
    weights' transform per pair of channels: the ratios scale F(2x2)'s measured constants to a
    tile size not yet measured."""
    t = transforms(tile)
    a, m = t.size, tile
    inputs = 2 * a * _nonzeros(t.bt) + 2 * a * a
    outputs = (a + m) * _nonzeros(t.at) + a * a + m * m
    weights = (TAPS + a) * _nonzeros(t.g) + TAPS * TAPS + a * a
    return inputs, outputs, weights
