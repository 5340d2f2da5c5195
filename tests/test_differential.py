"""Differential testing: random valid TC programs, compiled with ``tcpy.define`` and evaluated by
the reference evaluator (``tcpy.reference``), must agree.

Each generated program (``tests/strategies.py``) is checked three ways:

* the compiled kernel and the reference give the same outcome: the same output dtypes and
  shapes and equal values (integers and bool exactly, floats within a tolerance scaled by the
  dtype's epsilon and the reduction length), or both raise the same ``TCError`` subclass;
* the output shapes equal the generator's own range computation (an oracle for range
  inference that does not use ``tcpy.ranges``);
* run-time errors (an out-of-range lookup-table index, an unguarded integer division by
  zero) are raised by both, as ``TCRuntimeError``;
* for a quarter of the programs, the compiled kernel called again with ``out=`` arrays full of
  garbage gives the same results (elements no statement writes are zero).

The default run checks ``TCPY_FUZZ_EXAMPLES`` random programs (250) and a fifth as many
standard kernels (matmul variants, conv NCHW/NHWC, padded convolutions with inf and NaN
weights, pooling, reductions) with sizes up to ~70
and random schedule options (threads among 1, 2 and 7), derandomized so that reruns hit the
kernel disk cache; then a tenth as many of each built for every target preset this CPU can
execute (``x86-64``, ``x86-64-v3``, and ``x86-64-v4`` on AVX-512 CPUs). A longer, fresh run
is one variable away::

    TCPY_FUZZ_EXAMPLES=5000 TCPY_FUZZ_SEED=random python -m pytest tests/test_differential.py -q

(``TCPY_FUZZ_SHRINK=1`` also shrinks failures in the default run; it recompiles every candidate.)

Failures shrink to a minimal program; record it as the next numbered bug in
``tests/test_regressions.py``, a test whose docstring says what went wrong.
"""
import os
from typing import Optional

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings

import tcpy
from tcpy.lang import ast
from tcpy.lang.visit import inline_lets
from tcpy.reference import define_reference
from tcpy.target import PRESETS, Target

from strategies import GenProgram, kernel_programs, programs

EXAMPLES = int(os.environ.get("TCPY_FUZZ_EXAMPLES", "250"))
KERNEL_EXAMPLES = max(1, EXAMPLES // 5)
TARGET_EXAMPLES = max(1, EXAMPLES // 10)  # per preset, random programs and standard kernels each
RANDOM = os.environ.get("TCPY_FUZZ_SEED", "") == "random"
# Shrinking recompiles every candidate (minutes); on by default only in the long run.
SHRINK = os.environ.get("TCPY_FUZZ_SHRINK", "1" if RANDOM else "0") == "1"

MAX_VOLUME = 400_000
EPS = {np.dtype(np.float16): 2.0**-10, np.dtype(np.float32): 2.0**-23, np.dtype(np.float64): 2.0**-52}

SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=not RANDOM,
    database=None if not RANDOM else settings.default.database,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    print_blob=True,
    phases=tuple(Phase) if SHRINK else (Phase.explicit, Phase.reuse, Phase.generate),
)


def outcome(kernel, args):
    """("ok", outputs tuple) or ("error", exception) for one call; non-TCError exceptions escape."""
    try:
        result = kernel(*args)
    except tcpy.TCError as err:
        assert str(err), f"{type(err).__name__} without a message"
        return "error", err
    return "ok", result if isinstance(result, tuple) else (result,)


def least_float_precision(def_) -> float:
    """The epsilon of the least precise float type any expression of ``def_`` computes in.

    A literal computes nothing: a float32 ``0.1`` in a double kernel is the exact value
    (double)0.1f on every path, so it leaves the tolerance at double's."""
    eps = 0.0
    for stmt in def_.stmts:
        for node in inline_lets(stmt).rhs.walk():
            if isinstance(node, (ast.FloatLit, ast.IntLit)):
                continue
            if node.type is not None and node.type.is_float:
                eps = max(eps, EPS[np.dtype(node.type.numpy_name)])
    return eps


def assert_close(name: str, got: np.ndarray, want: np.ndarray, other: np.ndarray, prog: GenProgram,
                 eps: float = 0.0):
    """``got`` (compiled) matches ``want`` (reference) or ``other`` (the reference reducing in
    the reverse order) elementwise, within a tolerance that also covers their difference."""
    assert got.dtype == want.dtype, f"{name}: dtype {got.dtype} vs reference {want.dtype}"
    assert got.shape == want.shape, f"{name}: shape {got.shape} vs reference {want.shape}"
    if want.dtype.kind != "f" and eps == 0.0:  # integer all the way: exact
        np.testing.assert_array_equal(got, want, err_msg=f"output {name}")
        return
    # Float results depend on summation order, on float16 intermediates kept in float by gcc,
    # and on 1-ulp differences between libm and NumPy builtins: allow a few ulps (of the least
    # precise type the program computes in) per reduced term, plus what changing the order of
    # the reductions changes (which grows where later statements amplify it, e.g. cos(sum)).
    # Integers computed from floats inherit the float's rounding, and a truncating cast can
    # move them by one more.
    eps = max(eps, EPS.get(want.dtype, 0.0))
    rel = 16 * eps * (prog.reduction_length + 1)
    g, w, o = (a.astype(np.float64) for a in (got, want, other))
    finite = np.isfinite(w) & np.isfinite(g)
    scale = max(1.0, float(np.max(np.abs(w[finite]), initial=0.0)))
    both = np.isfinite(w) & np.isfinite(o)
    spread = np.abs(np.where(both, w, 0.0) - np.where(both, o, 0.0))
    atol = rel * scale + 4 * spread + (1.0 if want.dtype.kind != "f" else 0.0)
    ok = np.isclose(g, w, rtol=rel, atol=atol, equal_nan=True) | np.isclose(g, o, rtol=rel, atol=atol,
                                                                             equal_nan=True)
    if not ok.all():
        bad = np.argwhere(~ok)[:5]
        shown = "; ".join(f"{tuple(int(i) for i in ix)}: compiled {g[tuple(ix)]!r}, reference {w[tuple(ix)]!r}"
                          f" (reversed {o[tuple(ix)]!r})" for ix in bad)
        raise AssertionError(f"output {name}: {int((~ok).sum())} of {ok.size} elements differ "
                             f"(rtol {rel:.3g}): {shown}")


def check_program(prog: GenProgram, target: Optional[str] = None):
    def_ = tcpy.parse(prog.source).defs[0]  # valid by construction: a TCError here is a bug
    reference = define_reference(def_)
    options = tcpy.Options(**(prog.options or {}), target=target)
    compiled = tcpy.define(prog.source, options=options)
    ref_kind, ref_value = outcome(reference, prog.args)
    reversed_ = define_reference(def_, reverse_reductions=True)
    cc_kind, cc_value = outcome(compiled, prog.args)
    if ref_kind == "error":
        assert isinstance(ref_value, tcpy.TCRuntimeError), f"reference raised {ref_value!r}"
        assert cc_kind == "error", "the reference raised but the compiled kernel returned"
        assert type(cc_value) is type(ref_value), f"compiled raised {cc_value!r}, reference {ref_value!r}"
        return
    assert cc_kind == "ok", f"compiled raised {cc_value!r} but the reference returned"
    for name, want in zip(prog.outputs, ref_value):
        assert want.shape == prog.shapes[name], (
            f"output {name}: inferred shape {want.shape}, the generator computed {prog.shapes[name]}")
    assert len(cc_value) == len(ref_value)
    eps = least_float_precision(def_)
    _, other_value = outcome(reversed_, prog.args)
    for name, got, want, other in zip(prog.outputs, cc_value, ref_value, other_value):
        assert_close(name, got, want, other, prog, eps)
    if prog.use_out:  # out= arrays start with garbage: unwritten elements must still be zero
        outs = tuple(np.full(r.shape, 7, r.dtype) for r in ref_value)
        result = compiled(*prog.args, out=outs if len(outs) > 1 else outs[0])
        result = result if isinstance(result, tuple) else (result,)
        for name, given, got, want, other in zip(prog.outputs, outs, result, ref_value, other_value):
            assert got is given, f"out= for {name} was not used"
            assert_close(name, got, want, other, prog, eps)


@SETTINGS
@given(prog=programs())
def test_compiled_kernels_match_the_reference(prog):
    assume(prog.volume <= MAX_VOLUME)  # the reference materializes whole domains
    check_program(prog)


@settings(SETTINGS, max_examples=KERNEL_EXAMPLES)
@given(prog=kernel_programs())
def test_compiled_standard_kernels_match_the_reference(prog):
    assume(prog.volume <= 4 * MAX_VOLUME)
    check_program(prog)


@pytest.mark.parametrize("preset", PRESETS)
def test_every_runnable_target_matches_the_reference(preset):
    """Random programs and standard kernels (GEMM, convolutions, attention-like chains) built for
    each ISA level this CPU can execute."""
    if not Target.preset(preset).can_run_here():
        pytest.skip(f"this CPU ({Target.host().name}) cannot run {preset} code")

    @settings(SETTINGS, max_examples=TARGET_EXAMPLES)
    @given(prog=programs())
    def random_programs(prog):
        assume(prog.volume <= MAX_VOLUME)
        check_program(prog, preset)

    @settings(SETTINGS, max_examples=TARGET_EXAMPLES)
    @given(prog=kernel_programs())
    def standard_kernels(prog):
        assume(prog.volume <= 4 * MAX_VOLUME)
        check_program(prog, preset)

    random_programs()
    standard_kernels()
