"""Random valid TC programs and standard kernels (``tests/strategies.py``: matmuls, convolutions,
pooling, reductions, attention-like chains) on size-generic kernels: one kernel
(``Options(specialize="never")``) called at the generator's sizes, where it is planned, then at
other sizes (0, 1 and small primes for every size variable, new arrays of each parameter's
type), must give the reference evaluator's outcome at each: the same values (the comparison of
``tests/test_differential.py``), or the same ``TCError`` subclass (a precondition these sizes
break, an index table's value out of range at them).

Derandomized like the other property tests; ``TCPY_FUZZ_EXAMPLES`` scales it with them and
``TCPY_FUZZ_SEED=random`` draws new programs.
"""
from types import SimpleNamespace

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import tcpy
from tcpy.reference import define_reference

from strategies import kernel_programs, programs, random_array
from test_differential import EXAMPLES, MAX_VOLUME, SETTINGS, assert_close, least_float_precision, outcome

# sizes of the other calls: empty, one, and a few primes (every statement's domain stays small:
# the reference evaluator materialises it)
OTHER_SIZES = (0, 1, 2, 3, 5, 7)


def _arguments(def_, sizes, rng) -> list:
    """Arguments of ``def_`` at ``sizes``: each parameter an array of its type and shape (an int
    array of zeros and ones: as an index table, in range wherever its extent allows)."""
    args = []
    for param in def_.params:
        shape = param.type.shape(sizes)
        scalar = param.type.scalar
        if scalar.is_integral and scalar.numpy_name != "bool":
            args.append(rng.integers(0, 2, size=shape).astype(scalar.numpy_name))
        else:
            args.append(random_array(rng, scalar, shape))
    return args


def _check(def_, compiled, args, reduction_length: int) -> None:
    """``compiled`` and the reference agree on ``args``: the same values or the same error."""
    ref_kind, ref_value = outcome(define_reference(def_), args)
    cc_kind, cc_value = outcome(compiled, args)
    if ref_kind == "error":
        assert cc_kind == "error", f"the reference raised {ref_value!r} but the generic kernel returned"
        assert type(cc_value) is type(ref_value), f"generic kernel raised {cc_value!r}, reference {ref_value!r}"
        return
    assert cc_kind == "ok", f"generic kernel raised {cc_value!r} but the reference returned"
    _, other_value = outcome(define_reference(def_, reverse_reductions=True), args)
    eps = least_float_precision(def_)
    program = SimpleNamespace(reduction_length=reduction_length)  # (what assert_close reads of a program)
    for name, got, want, other in zip((r.name for r in def_.returns), cc_value, ref_value, other_value):
        assert_close(name, got, want, other, program, eps)


def _at_other_sizes(prog, data) -> None:
    """``prog`` on one size-generic kernel, at its own sizes, then at three draws of
    :data:`OTHER_SIZES`."""
    def_ = tcpy.parse(prog.source).defs[0]
    options = tcpy.Options(**{**(prog.options or {}), "specialize": "never"})
    compiled = tcpy.define(prog.source, options=options)
    _check(def_, compiled, prog.args, prog.reduction_length)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    for _ in range(3):
        sizes = {name: data.draw(st.sampled_from(OTHER_SIZES)) for name in def_.size_vars}
        # a reduction at these sizes sums at most the largest size to the power of its variables
        longest = max(prog.reduction_length, max(sizes.values(), default=1) ** 3)
        _check(def_, compiled, _arguments(def_, sizes, rng), longest)


@settings(SETTINGS, max_examples=max(1, EXAMPLES // 5))
@given(prog=programs(), data=st.data())
def test_a_generic_kernel_of_a_random_program_matches_the_reference_at_other_sizes(prog, data):
    assume(prog.volume <= MAX_VOLUME)
    _at_other_sizes(prog, data)


@settings(SETTINGS, max_examples=max(1, EXAMPLES // 25))
@given(prog=kernel_programs(), data=st.data())
def test_a_generic_kernel_of_a_standard_kernel_matches_the_reference_at_other_sizes(prog, data):
    assume(prog.volume <= 4 * MAX_VOLUME)
    _at_other_sizes(prog, data)
