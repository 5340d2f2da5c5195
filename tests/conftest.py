"""Shared pytest setup: the ``--accept`` switch and the ``golden`` fixture for golden files;
kernels take every CPU however busy the machine is (tests that count threads must not depend on
other processes' load: test_load_tolerance tests the load watch in processes of its own)."""
import difflib
import inspect
import os
from pathlib import Path

import pytest
from hypothesis import settings

os.environ.setdefault("TCPY_WATCH_LOAD", "0")  # (before anything imports tcpy: the launcher reads it then)
# the suite runs in several processes (pytest-xdist, see pyproject.toml): a waiting OpenMP thread
# of one must give its time slice to the others rather than spin (read when libgomp loads)
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

from strategies import DERANDOMIZE  # noqa: E402  (imports tcpy)

# every property test draws the same examples from run to run (a CI run repeats the last one's),
# unless TCPY_FUZZ_SEED=random asks for new ones
settings.register_profile("tcpy", derandomize=DERANDOMIZE)
settings.load_profile("tcpy")

import tcpy  # noqa: E402

GOLDEN_DIR = Path(__file__).parent / "golden"

#: Test modules that exercise the library's default, Options(specialize="auto") (size-generic
#: kernels first, tiering, the cache, the CLI, the README): the other modules test the
#: specialised kernels' paths and plans, so a kernel they define without choosing is specialised
#: to its shapes. Under "auto" their calls would run on a size-generic kernel, not the path they
#: check, and build one such library (every path of the run-time engine) per def, options and
#: target: most of the suite's time.
DEFAULT_SPECIALIZE_MODULES = ("test_api", "test_cache", "test_cli", "test_readme", "test_notebooks",
                              "test_load_tolerance", "test_sanitizer")
_SPECIALIZE_AT = list(inspect.signature(tcpy.Options.__init__).parameters).index("specialize") - 1  # (self)


@pytest.fixture(autouse=True)
def _specialised_unless_default_tested(request, monkeypatch):
    module = request.module.__name__.rsplit(".", 1)[-1]
    if module.startswith("test_generic") or module in DEFAULT_SPECIALIZE_MODULES:
        return
    defaults = list(tcpy.Options.__init__.__defaults__)
    defaults[_SPECIALIZE_AT] = "always"
    monkeypatch.setattr(tcpy.Options.__init__, "__defaults__", tuple(defaults))


#: At most this many test processes: each compiles with gcc and runs kernels on every CPU, so
#: more processes than this only oversubscribe the CPUs.
MAX_TEST_PROCESSES = 8


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one test process per CPU this process may run on, at most MAX_TEST_PROCESSES."""
    return max(1, min(len(os.sched_getaffinity(0)), MAX_TEST_PROCESSES))


#: The test files that take longest (a cold cache: minutes of compiling), run first so that no
#: process is still on one of them when the others have run out of files.
LONGEST_FIRST = ("test_sanitizer.py", "test_differential.py", "test_notebooks.py")


def pytest_collection_modifyitems(items):
    """Tests of :data:`LONGEST_FIRST` first, in its order (pytest-xdist hands files out in the
    order of their tests)."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST_FIRST)))  # (stable: the rest as collected)


def pytest_addoption(parser):
    parser.addoption(
        "--accept",
        action="store_true",
        default=False,
        help="write the actual output of golden tests into their expected files",
    )


class Golden:
    """Compare text with an expected file; with ``--accept``, (re)write the file instead."""

    def __init__(self, accept: bool):
        self.accept = accept

    def check(self, expected_path: Path, actual: str) -> None:
        if self.accept:
            expected_path.write_text(actual)
            return
        if not expected_path.exists():
            pytest.fail(f"missing golden file {expected_path}; run pytest with --accept to create it")
        expected = expected_path.read_text()
        if actual != expected:
            diff = "".join(
                difflib.unified_diff(
                    expected.splitlines(True), actual.splitlines(True), str(expected_path), "actual"
                )
            )
            pytest.fail(f"output differs from {expected_path} (accept with --accept):\n{diff}", pytrace=False)


@pytest.fixture
def golden(request) -> Golden:
    return Golden(request.config.getoption("--accept"))


@pytest.fixture
def builds(monkeypatch):
    """The kernels built (or found in the disk cache) by the test, as a list of symbols."""
    import tcpy.api

    built = []
    build = tcpy.api._build_and_load

    def counting(spec, options):
        built.append(spec.symbol)
        return build(spec, options)

    monkeypatch.setattr(tcpy.api, "_build_and_load", counting)
    return built
