"""Reports for people: :func:`explain`, and the message of a size precondition that fails.

Both read a :class:`~tcpy.ranges.inference.DefRanges` (the result of ``infer``), which calls
:func:`violation_message` when it is bound to sizes that break a precondition.
"""
from __future__ import annotations

from typing import Optional

import islpy as isl

from .isl_helpers import PARAM, value_at
from .symbolic import format_shape


def explain(def_ranges, sizes: Optional[dict] = None) -> str:
    """A readable report of ``def_ranges`` (from :func:`~tcpy.ranges.infer`): per statement each
    index variable's range (symbolic, and bound to numbers when ``sizes`` are given), output vs reduction, what fixed it; output shapes;
    preconditions (and whether ``sizes`` satisfy them); accesses checked at run time."""
    dr = def_ranges
    bound = point = None
    lines = [dr.def_.signature()]
    if sizes is not None:
        point = dr.size_point(sizes)
        bound = dr.evaluate(sizes, point)
        lines.append("  sizes: " + ", ".join(f"{k}={sizes[k]}" for k in dr.size_vars))
    roles = {t.name: t.role for t in dr.def_.tensors}
    for k, st in enumerate(dr.statements):
        lines.append(f"  statement {k + 1}: {st.stmt}")
        rows = []
        for var, vr in st.ranges.items():
            numbers = ""
            if bound is not None:
                lo, hi = bound.statements[k][var]
                numbers = f"= [{lo}, {hi})" if hi > lo else "= empty"
            rows.append((vr.kind, str(vr), numbers, f"({vr.origin})"))
        widths = [len("reduction")] + [max([len(r[c]) for r in rows] + [0]) for c in (1, 2)]
        for row in rows:
            cells = [cell.ljust(w) for cell, w in zip(row, widths)] + [row[3]]
            lines.append("    " + "  ".join(c for c in cells if c))
        for access in st.runtime_checked:
            lines.append(f"    checked at run time: {access} (index not affine in the sizes and index variables)")
    if dr.shapes:
        lines.append("  shapes:")
        for name, dims in dr.shapes.items():
            row = f"    {name}: {format_shape(dims)}" + ("" if bound is None else f" = {bound.shapes[name]}")
            lines.append(f"{row}  ({roles.get(name, 'output')})")
    if dr.preconditions:
        lines.append("  preconditions:")
        bad = set(map(id, dr.violated(point))) if point is not None else set()
        for pre in dr.preconditions:
            what = "output index >= 0 for" if pre.kind == "output" else "in bounds:"
            row = f"    {what} {pre.text} (line {pre.span.line}) requires {pre.requires}"
            if point is not None:
                row += "  VIOLATED" if id(pre) in bad else "  ok"
            lines.append(row)
    return "\n".join(lines)


def violation_message(dr, pre, sizes: dict, point: isl.Point) -> str:
    """Why the sizes ``point`` (``sizes`` as a dict) break precondition ``pre`` of ``dr``: the
    access and the values its indices take, or the output index range that starts below 0."""
    shown = ", ".join(f"{k}={sizes[k]}" for k in dr.size_vars)
    where = f"line {pre.span.line}" if pre.span and pre.span.line else "statement"
    head = f"in def '{dr.def_.name}', {where}: with sizes {shown}, "
    if pre.kind == "output":
        vr = pre.detail
        lo, hi = value_at(vr.lo_isl, point), value_at(vr.hi_isl, point)
        return (head + f"output index '{vr.var}' of {pre.text} would range over {lo} <= {vr.var} < {hi} "
                f"({vr}), below 0; these sizes must satisfy {pre.requires}")
    access, domain, indices = pre.detail
    fixed = domain.intersect_params(isl.Set.from_point(point))
    parts = []
    for d, index in indices:
        pa = index.intersect_domain(fixed)
        if not pa.domain().is_empty():
            parts.append(f"index {d} ({access.indices[d]}) takes values {pa.min_val()}..{pa.max_val()}")
    extent = _extent_text(dr, access.tensor, point, dr.shapes_isl)
    return (head + f"{pre.text} reads out of bounds of {access.tensor}{extent}: " + "; ".join(parts)
            + f" (these sizes must satisfy {pre.requires})")


def _extent_text(dr, tensor: str, point, info) -> str:
    if tensor in info:
        return f" (shape {tuple(value_at(d, point) or 0 for d in info[tensor])})"
    for p in dr.def_.params + dr.def_.returns:
        if p.name == tensor and p.type is not None:
            sizes = {name: point.get_coordinate_val(PARAM, pos).to_python() for pos, name in enumerate(dr.size_vars)}
            return f" (shape {p.type.shape(sizes)})"
    return ""
