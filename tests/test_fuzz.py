"""Fuzzing with invalid programs and arguments: the only allowed outcomes are success (a
mutation that is still valid) or a ``tcpy.TCError`` subclass with a non-empty message —
never another exception type, a crash or a hang.

Cases (``tests/strategies.py``): mutations of random valid programs (truncation, deleted,
inserted or replaced characters, random bytes, undefined names, swapped tokens, bad or
out-of-range ``where`` clauses, a dropped ``!``, wrong index counts, duplicate names) and of
their arguments (wrong rank, dtype, size or count, non-arrays, big-endian or Fortran-ordered
arrays), run through both backends; plus random text fed to the parser.

The probe's categories (issue 15): valid programs with their names renamed to isl, C, C++,
Python and libm keywords (compared with the reference), stress programs (long chains, deep
nesting, rank up to 34, zero sizes, huge constants, long names, many parameters, gathers; when
they run, compared with the reference), hostile calls of the public API, and command lines.

Default: 500 mutated cases, 200 random texts and ``TCPY_FUZZ_EXAMPLES`` (40) of each probe
category, derandomized (reruns hit the kernel disk cache). More:
``TCPY_FUZZ_INVALID_EXAMPLES=5000 TCPY_FUZZ_EXAMPLES=5000 TCPY_FUZZ_SEED=random``.
"""
import os
import signal
import warnings
from contextlib import contextmanager

import numpy as np
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

import tcpy

from strategies import Case, api_calls, cli_arguments, invalid_cases, renamed_programs, stress_cases

EXAMPLES = int(os.environ.get("TCPY_FUZZ_INVALID_EXAMPLES", "500"))
# The probe's categories (issue 15): keyword names, stress programs, API edges, CLI arguments.
PROBE_EXAMPLES = int(os.environ.get("TCPY_FUZZ_EXAMPLES", "40"))
RANDOM = os.environ.get("TCPY_FUZZ_SEED", "") == "random"
CASE_SECONDS = 60  # generous: a first compile takes ~0.3 s; a hang is what this catches


def fuzz_settings(n):
    return settings(
        max_examples=n,
        deadline=None,
        derandomize=not RANDOM,
        database=None,
        suppress_health_check=list(HealthCheck),
        phases=tuple(Phase) if RANDOM else (Phase.explicit, Phase.generate),
    )


class Hang(Exception):
    pass


@contextmanager
def time_limit(seconds: float):
    """Fail a case that runs longer than ``seconds`` (a hang) instead of blocking the suite."""

    def on_alarm(signum, frame):
        raise Hang(f"case still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_case(case: Case, backend: str) -> str:
    """Define and call; return "ok" or the TCError class name. Anything else propagates."""
    try:
        with time_limit(CASE_SECONDS), warnings.catch_warnings():
            warnings.simplefilter("ignore", tcpy.TCWarning)  # `+=` into a fresh output is valid
            kernel = tcpy.define(case.source, backend=backend)
            if not callable(kernel):  # several defs: a Library; call the first
                kernel = next(iter(kernel))
            kernel(*case.args)
    except tcpy.TCError as err:
        message = str(err)
        assert message.strip(), f"{type(err).__name__} with an empty message"
        assert "Traceback" not in message
        return type(err).__name__
    return "ok"


@fuzz_settings(EXAMPLES)
@given(case=invalid_cases())
def test_invalid_programs_and_arguments_raise_tc_errors(case):
    compiled = run_case(case, "compiled")
    reference = run_case(case, "reference")
    # The front end, ranges and argument checks are shared: both backends fail the same way,
    # except run-time errors, which both must raise too.
    assert compiled == reference, f"compiled: {compiled}, reference: {reference}"
    event(f"{case.what} -> {compiled}")  # shown by pytest --hypothesis-show-statistics


@fuzz_settings(EXAMPLES // 5 * 2)
@given(text=st.one_of(st.text(max_size=200), st.binary(max_size=200).map(lambda b: b.decode("latin-1"))))
def test_random_text_is_rejected_with_a_program_error_or_round_trips(text):
    try:
        with time_limit(CASE_SECONDS):
            program = tcpy.parse(text)
    except tcpy.TCError as err:
        assert isinstance(err, tcpy.TCProgramError), f"{type(err).__name__} for a bad program"
        assert str(err).strip()
        return
    assert tcpy.parse(str(program)) == program  # whatever parses prints as equivalent source


def test_a_known_bad_case_for_each_mutation_kind():
    """The mutation kinds the strategy draws, one fixed example each, with their error class."""
    src = "def f(float(M,K) A, float(K,N) B) -> (C) {\n    C(m, n) +=! A(m, k) * B(k, n)\n}\n"
    A, B = np.ones((2, 3), np.float32), np.ones((3, 4), np.float32)
    cases = [
        (src[:30], [A, B], "TCSyntaxError"),
        (src.replace("B(k, n)", "Q(k, n)"), [A, B], "TCSemanticError"),
        (src.replace("+=!", "+="), [A, B], "ok"),  # TC: adds to the output's values (a TCWarning)
        (src.replace("}\n", " where k in 0:K + 3\n}\n"), [A, B], "TCRangeError"),
        (src.replace("A(m, k)", "A(m, k, 0)"), [A, B], "TCSemanticError"),
        (src, [A, B[:2]], "TCShapeError"),
        (src, [A.astype(np.float64), B], "TCArgumentError"),
        (src, [A[None], B], "TCArgumentError"),
        (src, [A], "TCArgumentError"),
        (src, ["A", B], "TCArgumentError"),
        (src.replace("(C)", "(C, C)"), [A, B], "TCSemanticError"),
        ("\x00" + src, [A, B], "TCSyntaxError"),
    ]
    for source, args, expected in cases:
        for backend in ("compiled", "reference"):
            assert run_case(Case("fixed", source, args), backend) == expected, (source, backend)


def _same_as_reference(case: Case) -> None:
    """Both backends raise the same TCError, or return the same values (rtol 1e-5)."""
    results = {}
    for backend in ("compiled", "reference"):
        try:
            with time_limit(CASE_SECONDS), warnings.catch_warnings():
                warnings.simplefilter("ignore", tcpy.TCWarning)
                results[backend] = tcpy.define(case.source, backend=backend)(*case.args)
        except tcpy.TCError as err:
            assert str(err).strip()
            results[backend] = type(err).__name__
    got, want = results["compiled"], results["reference"]
    assert isinstance(got, str) == isinstance(want, str), f"compiled: {got!r}, reference: {want!r}"
    event(f"{case.what} -> {got if isinstance(got, str) else 'ok'}")
    if isinstance(got, str):
        assert got == want
        return
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, equal_nan=True)


@fuzz_settings(PROBE_EXAMPLES)
@given(prog=renamed_programs())
def test_programs_with_keyword_names_match_the_reference(prog):
    from test_differential import MAX_VOLUME, check_program

    if prog.volume <= MAX_VOLUME:
        with time_limit(CASE_SECONDS):
            check_program(prog)


@fuzz_settings(PROBE_EXAMPLES)
@given(case=stress_cases())
def test_stress_programs_run_or_raise_tc_errors_like_the_reference(case):
    _same_as_reference(case)


@fuzz_settings(PROBE_EXAMPLES)
@given(call=api_calls())
def test_hostile_api_calls_raise_tc_errors(call):
    what, thunk = call
    try:
        with time_limit(CASE_SECONDS), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            thunk()
    except tcpy.TCError as err:
        assert str(err).strip()
        event(f"{what.split('(')[0]} -> {type(err).__name__}")
        return
    event(f"{what.split('(')[0]} -> ok")


def test_hostile_command_lines_exit_cleanly(tmp_path_factory):
    """Exit status 0, 1 or 2 with a message, never a traceback (issue 15, item 4)."""
    import io
    from contextlib import redirect_stderr, redirect_stdout

    from tcpy.cli import main

    root = tmp_path_factory.mktemp("cli")
    files = {"good": root / "good.tc", "bad": root / "bad.tc", "binary": root / "bin.tc", "missing": str(root / "no")}
    files["good"].write_text("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }\n")
    files["bad"].write_text("def mm(float(M) A) -> (C) { C(m) = Q(m) }\n")
    files["binary"].write_bytes(b"def \xff\xfe")
    files = {k: str(v) for k, v in files.items()}
    cache = os.environ.get("TCPY_CACHE_DIR")
    os.environ["TCPY_CACHE_DIR"] = str(root / "cache")  # `cache clear` must not clear the suite's cache

    @fuzz_settings(PROBE_EXAMPLES)
    @given(argv=cli_arguments(files))
    def run(argv):
        err = io.StringIO()
        try:
            with time_limit(CASE_SECONDS), redirect_stdout(io.StringIO()), redirect_stderr(err):
                status = main(argv)
        except SystemExit as exit_:
            status = exit_.code
        assert status in (0, 1, 2), (argv, status, err.getvalue())
        assert "Traceback" not in err.getvalue()
        if status:
            assert err.getvalue().strip(), argv
        event(f"{argv[0]} -> {status}")

    try:
        run()
    finally:
        if cache is None:
            os.environ.pop("TCPY_CACHE_DIR", None)
        else:
            os.environ["TCPY_CACHE_DIR"] = cache
