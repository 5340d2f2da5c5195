"""Gradients of TC defs: the backward of a def is another def, compiled like any other.

``tcpy.grad(kernel, wrt=("A", "B"))`` returns a kernel whose inputs are the forward inputs
followed by one cotangent per floating-point output (``dC``, the shape of ``C``) and whose
outputs are the cotangents of ``wrt`` (``dA``, ``dB``): the vector-Jacobian product.
``grad_kernel.source`` is its TC text. See :mod:`.reverse` for how statements are
differentiated and :mod:`.derivatives` for the builtins' derivatives.
"""
from __future__ import annotations

from typing import Optional, Union

from .. import binding
from ..api import Kernel
from ..errors import TCArgumentError, TCShapeError
from ..lang import parse
from ..reference import ReferenceKernel, define_reference
from .reverse import backward_source, default_wrt

__all__ = ["grad", "vjp", "value_and_grad", "BackwardKernel"]

Wrt = Optional[Union[str, tuple, list]]


def grad(kernel, wrt: Wrt = None):
    """The backward kernel of ``kernel``: ``grad(k, wrt=("A",))(A, B, dC)`` is ``dA``.

    Its inputs are ``kernel``'s followed by one cotangent per floating-point output (the
    seed, e.g. ones for a sum); its outputs are the cotangents of ``wrt`` (every
    floating-point input when None), in order. Works on compiled and ``backend="reference"``
    kernels and returns the same kind. Raises :class:`~tcpy.TCSemanticError` naming the
    statement when something has no derivative (an integer output, ``%`` of a differentiated
    value, ``*=`` into earlier values).
    """
    return _backward(kernel, wrt, with_values=False)


def vjp(kernel, wrt: Wrt = None):
    """The vector-Jacobian product of ``kernel``: the same kernel as :func:`grad` (the name
    JAX and PyTorch use for a backward that takes the output cotangents)."""
    return grad(kernel, wrt)


def value_and_grad(kernel, wrt: Wrt = None):
    """A kernel that runs forward and backward as one def: its inputs are those of
    :func:`grad`, its outputs ``kernel``'s outputs followed by the cotangents of ``wrt``.

    Temporaries of the forward are computed once and read by the backward directly.
    """
    return _backward(kernel, wrt, with_values=True)


def _backward(kernel, wrt: Wrt, *, with_values: bool):
    if not isinstance(kernel, (Kernel, ReferenceKernel)):
        raise TCArgumentError(f"expected a kernel made by tcpy.define, got {type(kernel).__name__}")
    def_ = kernel.def_
    if wrt is None:
        wrt = default_wrt(def_)
    elif isinstance(wrt, str):
        wrt = (wrt,)
    elif not isinstance(wrt, (tuple, list)) or not all(isinstance(w, str) for w in wrt):
        raise TCArgumentError(f"wrt must be an input name or a tuple of them, got {wrt!r}")
    source = backward_source(def_, kernel.ranges, getattr(kernel, "source", ""), tuple(wrt),
                             with_values=with_values)
    (backward,) = parse(source).defs
    if isinstance(kernel, ReferenceKernel):
        return define_reference(backward, source)
    return BackwardKernel(backward, source, kernel.options, forward=kernel)


class BackwardKernel(Kernel):
    """A compiled backward: its first call with given shapes also checks that each cotangent
    has the shape of its output (an output extent that is not a size variable, such as a valid
    convolution's ``H - KH + 1``, is a size of its own in the backward def, so nothing else
    would notice a cotangent that is too large)."""

    def __init__(self, def_, source, options=None, *, forward: Kernel, def_ranges=None):
        super().__init__(def_, source, options, def_ranges=def_ranges)
        self.forward = forward

    def with_options(self, options):
        """The same backward with other options."""
        return BackwardKernel(self.def_, self.source, options, forward=self.forward, def_ranges=self.ranges)

    def _launch_entry(self, args):
        forward = self.forward.def_
        n = len(forward.params)
        _, sizes = binding.bind_arguments(forward, args[:n])
        shapes = self.forward.ranges.bind(sizes).shapes
        floats = [r.name for r in forward.returns if forward.tensor(r.name).scalar.is_float]
        for position, output in enumerate(floats, n):
            if position < len(args) and hasattr(args[position], "shape"):
                expected, got = tuple(shapes[output]), tuple(args[position].shape)
                if expected != got:
                    raise TCShapeError(
                        f"def '{self.def_.name}': cotangent {self.def_.params[position].name} must have "
                        f"the shape of output {output}, {expected}, got {got}")
        return super()._launch_entry(args)
