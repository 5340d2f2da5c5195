"""Every isl, C, C++, Python and libm keyword (and tcpy's own C names) as an index variable, a
size variable and a tensor name: the result equals the reference evaluator's, or both backends
reject the name with the same :class:`tcpy.TCError` (TC keywords, builtins).

User names must never reach isl's parser or the C source as text (issue 15, item 2: an index
variable named ``nan`` made isl read NaN and the kernel return unwritten memory). Each
(role, name) is checked through range inference, loop IR and C generation, without gcc; one
kernel per role then holds every accepted name and is compiled and run. (A size variable
named ``self`` once collided with ``Kernel.specialize(self, **sizes)``.)
"""
import keyword
import warnings

import numpy as np
import pytest

import tcpy

# isl's lexer compares keywords case-insensitively (strcasecmp in isl_stream.c).
ISL = ["exists", "and", "or", "implies", "not", "infty", "infinity", "NaN", "rat", "true", "false",
       "ceild", "floord", "mod", "ceil", "floor", "min", "max", "domain", "context", "schedule"]
ISL_CASES = sorted({v for w in ISL for v in (w, w.upper(), w.capitalize())} | {"nan", "Nan", "INFINITY"})
C = ["auto", "break", "case", "char", "const", "continue", "default", "do", "double", "else", "enum",
     "extern", "float", "for", "goto", "if", "inline", "int", "long", "register", "restrict", "return",
     "short", "signed", "sizeof", "static", "struct", "switch", "typedef", "union", "unsigned", "void",
     "volatile", "while", "_Alignas", "_Alignof", "_Atomic", "_Bool", "_Complex", "_Generic",
     "_Imaginary", "_Noreturn", "_Static_assert", "_Thread_local", "alignas", "alignof", "bool",
     "constexpr", "nullptr", "static_assert", "thread_local", "typeof", "asm", "__asm__",
     "__attribute__", "NULL", "EOF", "errno", "I", "main", "size_t", "int64_t", "int32_t", "uint8_t",
     "INT64_C", "INT32_MAX", "M_PI", "HUGE_VAL", "omp", "pragma", "define", "include"]
CXX = ["and_eq", "bitand", "bitor", "catch", "class", "compl", "concept", "const_cast", "consteval",
       "constinit", "co_await", "co_return", "co_yield", "decltype", "delete", "dynamic_cast",
       "explicit", "export", "friend", "mutable", "namespace", "new", "noexcept", "not_eq", "operator",
       "or_eq", "private", "protected", "public", "reinterpret_cast", "requires", "static_cast",
       "template", "this", "throw", "try", "typeid", "typename", "using", "virtual", "wchar_t", "xor",
       "xor_eq", "char8_t", "char16_t", "char32_t"]
PYTHON = keyword.kwlist + keyword.softkwlist + ["self", "np", "print", "None_", "__init__"]
LIBM = ["sin", "cos", "tan", "exp", "log", "pow", "sqrt", "fabs", "fmod", "round", "trunc", "hypot",
        "atan2", "erf", "lgamma", "tgamma", "j0", "j1", "jn", "y0", "y1", "yn", "gamma", "signbit",
        "isnan", "isinf", "isfinite", "nan", "nanf", "fmin", "fmax", "abs", "div", "exp10", "expf",
        "sinf", "logf", "frexp", "ldexp", "modf", "remainder", "fma", "cbrt", "log1p", "expm1",
        "nearbyint", "rint", "lround", "copysign", "scalbn", "ilogb", "logb", "nextafter", "sincos"]
# The names tcpy's generated C uses itself, and TC's scalar type names.
TCPY = ["err", "tcpy_err", "tcpy_divzero", "tcpy_acc", "tcpy_nan", "tcpy_tile", "tcpy_buffers",
        "tcpy_num_threads", "tcpy_checked_index", "tcpy_stop", "c0", "c1", "t_A", "x0", "x1", "S0",
        "S_0", "float16", "float32", "float64", "half", "int8", "uint64", "int64", "def", "where",
        "in", "let", "A", "N", "i", "C"]
NAMES = sorted(set(ISL_CASES + C + CXX + PYTHON + LIBM + TCPY))

# Each role: a template and the expected value on A = [0, 1, 2] (float32).
A = np.arange(3, dtype=np.float32)
ROLES = {
    "index": ("def f(float(N) A) -> (O) {{ O({x}) = A({x}) + 1 }}", A + 1),
    "reduction": ("def f(float(N) A) -> (O) {{ O(zz) +=! A({x}) * float(zz + 1) where zz in 0:2 }}",
                  np.array([3, 6], np.float32)),
    "size": ("def f(float({x}) A) -> (O) {{ O(i) = A(i) * {x} }}", A * 3),
    "input": ("def f(float(N) {x}) -> (O) {{ O(i) = {x}(i) + 1 }}", A + 1),
    "output": ("def f(float(N) A) -> ({x}) {{ {x}(i) = A(i) + 1 }}", A + 1),
    "temporary": ("def f(float(N) A) -> (O) {{ {x}(i) = A(i) + 1\n O(i) = {x}(i) * 2 }}", (A + 1) * 2),
}

def _outcome(source: str, backend: str):
    """("ok", kernel) or ("error", TCError class name)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", tcpy.TCWarning)
            return "ok", tcpy.define(source, backend=backend)
    except tcpy.TCError as err:
        assert str(err).strip()
        return "error", type(err).__name__


@pytest.mark.parametrize("role, name", [pytest.param(r, n, id=f"{r}-{n}") for r in ROLES for n in NAMES])
def test_name_in_every_role_matches_the_reference(role, name):
    template, expected = ROLES[role]
    source = template.format(x=name)
    ref_status, ref = _outcome(source, "reference")
    cmp_status, kernel = _outcome(source, "compiled")
    assert ref_status == cmp_status, (ref, kernel)
    if ref_status == "error":
        assert ref == kernel
        return
    np.testing.assert_array_equal(ref(A), expected)
    assert kernel.c_source(A)  # isl loop nests and the C, without gcc


def _accepted(role):
    template = ROLES[role][0]
    return [n for n in NAMES if _outcome(template.format(x=n), "reference")[0] == "ok"]


# One compiled kernel per role, holding every accepted name at once (one gcc run each).
BATCHES = {
    "index": ("def f(float(N) A) -> ({outs}) {{\n{body}\n}}", "O{k}({x}) = A({x}) + {k}"),
    "size": ("def f({ins}) -> ({outs}) {{\n{body}\n}}", "O{k}(i) = I{k}(i) * {x}"),
    "input": ("def f({ins}) -> ({outs}) {{\n{body}\n}}", "O{k}(i) = {x}(i) + {k}"),
    "temporary": ("def f(float(N) A) -> ({outs}) {{\n{body}\n}}", "{x}(i) = A(i) + {k}\nO{k}(i) = {x}(i) * 2"),
}


# Range inference is slow with hundreds of size variables in one def: sizes go 16 per def.
CHUNK = {"size": 16}


@pytest.mark.parametrize("role", sorted(BATCHES))
def test_every_accepted_name_compiles_and_runs(role):
    names = _accepted(role)
    assert len(names) > 100
    step = CHUNK.get(role, len(names))
    for start in range(0, len(names), step):
        chunk = names[start:start + step]
        head, stmt = BATCHES[role]
        outs = ", ".join(f"O{k}" for k in range(len(chunk)))
        ins = ", ".join(f"float({x}) I{k}" if role == "size" else f"float(N) {x}" for k, x in enumerate(chunk))
        body = "\n".join(stmt.format(k=k, x=x) for k, x in enumerate(chunk))
        source = head.format(outs=outs, ins=ins, body=body)
        args = [A] * len(chunk) if role in ("size", "input") else [A]
        got = tcpy.define(source)(*args)
        want = tcpy.define(source, backend="reference")(*args)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
