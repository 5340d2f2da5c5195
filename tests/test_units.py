"""Libraries compiled from several translation units: a size-generic kernel's routines as units
(tcpy.codegen.units), compiled side by side and linked into the one cache entry of their source
(tcpy.runtime.build)."""
import ctypes
import re
import textwrap

import numpy as np
import pytest

import tcpy
from tcpy import TCCompilerError, demo
from tcpy.codegen.units import units
from tcpy.runtime import build

from test_cache import cache, finish, spawn  # noqa: F401 (a fixture)

# Two routines in units of their own (one with flags) and the kernel: `first` and `second` ask
# for the same scratch slot, the kernel reports whether they got one buffer, and WHICH (a flag of
# the second unit, that the user's flags may override).
UNITS_SOURCE = textwrap.dedent("""\
    #include "tcpy_runtime.h"
    /* {tag} */
    TCPY_ROUTINE void *first(void);
    TCPY_ROUTINE int second(void *seen);
    /* tcpy unit */
    TCPY_ROUTINE void *first(void) {{
        return tcpy_scratch(0, 64);
    }}
    /* tcpy unit: -DWHICH=7 */
    TCPY_ROUTINE int second(void *seen) {{
        return tcpy_scratch(0, 64) == seen ? WHICH : -1;
    }}
    /* tcpy unit */
    int k(void *const *buffers, int num_threads, int64_t *err, const volatile int *stop) {{
        (void)num_threads; (void)err; (void)stop;
        float *out = buffers[0];
        out[0] = (float)second(first()) * 6.0f;
        return 0;
    }}
    """)


def run(path) -> float:
    out = (ctypes.c_float * 1)()
    fn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(
        build.load_symbol(path, "k"))
    assert fn((ctypes.c_void_p * 1)(ctypes.addressof(out)), 1, None, None) == 0
    return out[0]


def test_units_share_one_scratch_and_take_their_flags(cache):
    source = UNITS_SOURCE.format(tag="flags")
    assert run(build.build_library(source)) == 42.0  # one scratch buffer per library, WHICH from its unit
    # the user's flags come after a unit's
    assert run(build.build_library(source, user_flags=["-UWHICH", "-DWHICH=2"])) == 12.0


def test_translation_units_group_by_flags_keep_order_and_lines():
    source = UNITS_SOURCE.format(tag="order")
    lines = source.split("\n")
    for jobs in (1, 2, 8):
        parts = build.translation_units(source, "lib.c", jobs)
        assert {flags for flags, _ in parts} == {(), ("-DWHICH=7",)}
        assert 2 <= len(parts) <= 3  # pieces of one flags, at most one per unit
        units = [match.groups() for _, text in parts for match in re.finditer(r'#line (\d+) "lib.c"\n(.*)\n', text)]
        assert sorted(int(line) for line, _ in units) == [6, 10, 14]  # each unit once
        for line, first_line in units:
            assert lines[int(line) - 1] == first_line  # gcc reports the source's lines
        for _, text in parts:
            assert text.startswith('#include "tcpy_runtime.h"')  # the declarations first
            at = [int(line) for line in re.findall(r"#line (\d+)", text)]
            assert at == sorted(at)  # in the order of the source
    assert build.translation_units("int k(void) { return 0; }\n", "lib.c", 4) == [((), "int k(void) { return 0; }\n")]


def test_a_compile_error_names_the_line_of_the_source(cache):
    source = UNITS_SOURCE.format(tag="error").replace("return tcpy_scratch(0, 64);", "return undeclared;")
    with pytest.raises(TCCompilerError, match=r"\.c:7:\d+: error: 'undeclared' undeclared"):
        build.build_library(source)


def test_two_processes_building_one_library_of_units(cache, tmp_path):  # noqa: F811
    source_file = tmp_path / "k.c"
    source_file.write_text(UNITS_SOURCE.format(tag="processes"))  # (the child checks the kernel writes 42)
    procs = [spawn(source_file, cache.parent) for _ in range(2)]
    assert sorted(finish(p) for p in procs) == [0, 1]  # one of them compiled (all its units)
    assert len(list(cache.glob("*.so"))) == 1
    assert not [f for f in cache.iterdir() if f.name.startswith(".")]  # no units or objects left


def generic_source(case) -> str:
    """The C of ``case``'s size-generic kernel (planned at its shapes, for x86-64-v3)."""
    kernel = tcpy.define(case.source, options=tcpy.Options(target="x86-64-v3"))
    args = case.make_args(np.random.default_rng(0))
    return kernel._generic_plan(kernel._sizes(args, {})).c_source


def definitions(source: str) -> list[str]:
    """The names of the functions ``source`` defines at file scope."""
    return re.findall(r"^(?:TCPY_ROUTINE |static |int ).*?([A-Za-z_0-9]+)\((?!\().*\{$", source, re.M)


def test_a_generic_kernel_is_in_units_each_routine_once():
    source = generic_source(demo.attention_case(1, 2, 40, 16))
    marks = [line for line in source.split("\n") if line.startswith(build.UNIT_MARK)]
    routines = re.findall(r"^TCPY_ROUTINE .*\{$", source, re.M)
    assert len(marks) == len(routines) + 1  # each routine and the kernel function in a unit
    assert "/* tcpy unit: -O2 */" in marks and "/* tcpy unit */" in marks
    names = definitions(source)
    assert len(names) == len(set(names))
    # the products on one whole row run the block products' routines (the same but for names)
    assert not [name for name in names if "_whole_" in name and not name.endswith("_cell")]


def test_units_keeps_a_source_it_cannot_read_whole():
    open_function = "#include <x.h>\n/* tcpy unit: -O2 */\nstatic void f(void) {\n    g();\nint h;\n"
    assert units(open_function) == "#include <x.h>\nstatic void f(void) {\n    g();\nint h;\n"
    assert units("int x;\n") == "int x;\n"
