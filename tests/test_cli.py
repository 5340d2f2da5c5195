"""The ``tcpy`` command line: check / explain / emit / cache / demo, exit codes and messages."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tcpy.cli import main

MATMUL = """\
def matmul(float(M,K) A, float(K,N) B) -> (C) {
    C(m, n) +=! A(m, k) * B(k, n)
}
"""

TWO_DEFS = MATMUL + """
def scale(float(N) X, float s) -> (Y) {
    Y(i) = s * X(i)
}
"""

BAD_NAME = """\
def matmul(float(M,K) A, float(K,N) B) -> (C) {
    C(m, n) +=! A(m, k) * Q(k, n)
}
"""

UNBOUNDED = """\
def f(float(N) X) -> (Y) {
    Y(i, j) = X(i)
}
"""


@pytest.fixture
def tc_file(tmp_path):
    def write(text, name="kernel.tc"):
        path = tmp_path / name
        path.write_text(text)
        return str(path)
    return write


@pytest.fixture
def cache(tmp_path, monkeypatch):
    directory = tmp_path / "cache"
    monkeypatch.setenv("TCPY_CACHE_DIR", str(directory))
    return directory


def test_check_ok_prints_signatures(tc_file, capsys):
    path = tc_file(TWO_DEFS)
    assert main(["check", path]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [f"{path}: ok: def matmul(float(M, K) A, float(K, N) B) -> (C)",
                   f"{path}: ok: def scale(float(N) X, float s) -> (Y)"]


def test_check_error_is_rendered_like_a_compiler(tc_file, capsys):
    path = tc_file(BAD_NAME)
    assert main(["check", path]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert lines[0].startswith(f"{path}:2:27: error: in def 'matmul': ")
    assert "'Q'" in lines[0]
    assert lines[1] == "        C(m, n) +=! A(m, k) * Q(k, n)"
    assert lines[2].startswith("    " + " " * 26 + "^")


def test_check_reports_range_errors_and_continues_with_other_files(tc_file, capsys):
    bad = tc_file(UNBOUNDED, "bad.tc")
    good = tc_file(MATMUL, "good.tc")
    assert main(["check", bad, good]) == 1
    captured = capsys.readouterr()
    assert captured.err.startswith(f"{bad}:2:")
    assert "in def 'f'" in captured.err and "'j'" in captured.err and "where" in captured.err
    assert captured.out == f"{good}: ok: def matmul(float(M, K) A, float(K, N) B) -> (C)\n"


def test_check_reads_standard_input(monkeypatch, capsys):
    import io
    monkeypatch.setattr(sys, "stdin", io.StringIO(BAD_NAME))
    assert main(["check", "-"]) == 1
    assert capsys.readouterr().err.startswith("<stdin>:2:27: error: in def 'matmul'")


def test_missing_file_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["check", str(tmp_path / "nope.tc")])
    assert exit_.value.code == 2
    assert "tcpy check: error: cannot read" in capsys.readouterr().err


def test_bad_sizes_argument(tc_file, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["explain", tc_file(MATMUL), "--sizes", "M=64,N"])
    assert exit_.value.code == 2
    assert "bad size 'N': expected NAME=INTEGER" in capsys.readouterr().err


def test_explain_symbolic_and_bound(tc_file, capsys):
    path = tc_file(MATMUL)
    assert main(["explain", path]) == 0
    symbolic = capsys.readouterr().out
    assert "0 <= m < M" in symbolic and "0 <= k < K" in symbolic
    assert "C: (M, N)" in symbolic
    assert main(["explain", path, "--sizes", "M=64,N=32,K=16"]) == 0
    bound = capsys.readouterr().out
    assert "(64, 32)" in bound and "[0, 16)" in bound


def test_explain_needs_name_for_several_defs(tc_file, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["explain", tc_file(TWO_DEFS)])
    assert exit_.value.code == 2
    assert "several defs (matmul, scale); pick one with --name" in capsys.readouterr().err
    assert main(["explain", tc_file(TWO_DEFS), "--name", "scale", "--sizes", "N=7"]) == 0
    assert "(7,)" in capsys.readouterr().out


def test_explain_unknown_size_is_an_error(tc_file, capsys):
    assert main(["explain", tc_file(MATMUL), "--sizes", "M=4,N=4,K=4,Z=3"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("tcpy explain: error: def 'matmul' has no size variable 'Z'")


def test_emit_prints_c_with_baked_sizes(tc_file, capsys, tmp_path):
    path = tc_file(MATMUL)
    assert main(["emit", path, "--sizes", "M=64,N=32,K=16"]) == 0
    c_source = capsys.readouterr().out
    assert '#include "tcpy_runtime.h"' in c_source
    assert "tcpy_matmul_" in c_source
    out = tmp_path / "k.c"
    assert main(["emit", path, "--sizes", "M=64,N=32,K=16", "-o", str(out)]) == 0
    assert out.read_text() == c_source
    assert capsys.readouterr().err.startswith(f"wrote {out} (")


def test_emit_requires_sizes(tc_file, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["emit", tc_file(MATMUL)])
    assert exit_.value.code == 2
    assert "--sizes" in capsys.readouterr().err


def test_emit_passes_schedule_options(tc_file, capsys):
    path = tc_file(MATMUL)
    sizes = ["--sizes", "M=256,N=256,K=256", "--threads", "2"]  # explicit: CI may have 1 CPU
    assert main(["emit", path, *sizes]) == 0
    assert "omp parallel" in capsys.readouterr().out
    assert main(["emit", path, *sizes, "--no-parallel"]) == 0
    assert "omp parallel" not in capsys.readouterr().out
    assert main(["emit", path, *sizes, "--tile", "m=0,n=0,k=0", "--order", "n,m,k"]) == 0
    assert "order n, m, k" in capsys.readouterr().out


def test_cache_info_and_clear(cache, capsys):
    import numpy as np
    import tcpy

    kernel = tcpy.define(MATMUL, options=tcpy.Options(specialize="always"))
    kernel(np.ones((2, 3), np.float32), np.ones((3, 4), np.float32))
    assert main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert f"directory: {cache}" in out
    assert "kernels:   1 (0 size-generic, 1 specialised to shapes)" in out
    scale = tcpy.define("def scale(float(N) A) -> (B) { B(i) = 2 * A(i) }")  # one kernel for both shapes
    scale(np.ones(3, np.float32))
    scale(np.ones(5, np.float32))
    assert main(["cache", "info"]) == 0
    assert "kernels:   2 (1 size-generic, 1 specialised to shapes)" in capsys.readouterr().out
    assert main(["cache", "clear"]) == 0
    assert capsys.readouterr().out == f"removed 2 compiled kernels from {cache}\n"
    assert main(["cache", "info"]) == 0
    assert "kernels:   0" in capsys.readouterr().out


def test_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for command in ("check", "explain", "emit", "cache", "demo"):
        assert f"    {command} " in out


def _run(*argv, env=None):
    return subprocess.run([sys.executable, "-m", "tcpy", *argv], capture_output=True, text=True,
                          env=env, timeout=300, cwd=Path(__file__).parent.parent)


def test_python_dash_m_exit_status(tc_file):
    result = _run("check", tc_file(BAD_NAME))
    assert result.returncode == 1
    assert ":2:27: error: in def 'matmul'" in result.stderr


def test_demo_runs_and_matches_numpy(tmp_path):
    """The README's first command: every kernel matches NumPy and the table has one row each."""
    env = dict(os.environ, TCPY_CACHE_DIR=str(tmp_path / "cache"))
    result = _run("demo", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split()[:3] == ["kernel", "shapes", "matches"]
    rows = {line.split()[0]: line for line in lines[1:4]}
    assert set(rows) == {"gemm", "conv2d", "attention"}
    assert all("  yes  " in row for row in rows.values())
    assert lines[4].startswith("speed vs NumPy = NumPy time / tcpy time")


@pytest.mark.parametrize("argv, words", [
    (["check", "{bad_utf8}"], "cannot read {bad_utf8}: expected UTF-8 text, found byte 0xff at offset 4"),
    (["explain", "{file}", "--threads", "0"], "argument --threads: expected an integer >= 1, got '0'"),
    (["explain", "{file}", "--sizes", f"M={10**30},N=2,K=2"], "size M of def 'matmul' must be from 0 to"),
    (["emit", "{file}", "--sizes", "M=2,N=2,K=2", "-o", "{missing}/out.c"], "cannot write {missing}/out.c: No such file"),
])
def test_bad_command_lines_print_one_line_and_exit_2(tc_file, tmp_path, capsys, argv, words):
    """Issue 15, item 4: no traceback for files that cannot be read or written, or bad values."""
    names = {"file": tc_file(MATMUL), "bad_utf8": str(tmp_path / "bad.tc"), "missing": str(tmp_path / "no-dir")}
    (tmp_path / "bad.tc").write_bytes(b"def \xff")
    with pytest.raises(SystemExit) as exit_:
        main([a.format(**names) for a in argv])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert words.format(**names) in err[-1] and len([e for e in err if "error" in e]) == 1


def test_tune_records_the_fastest_schedule(tc_file, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TCPY_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["tune", tc_file(MATMUL), "--sizes", "M=16,N=16,K=16", "--repeat", "1", "-q"]) == 0
    out = capsys.readouterr().out
    assert "recorded for these sizes: Options(" in out
    assert (tmp_path / "cache" / "tuned.json").is_file()
