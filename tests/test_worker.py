"""The worker process that builds the kernels specialised in the background."""
import os

import pytest

import tcpy
from tcpy.runtime import worker


def test_the_worker_runs_a_function_in_another_process_with_the_caller_s_environment(monkeypatch):
    assert worker.run(os.getpid) != os.getpid()
    monkeypatch.setenv("TCPY_WORKER_TEST", "seen")  # set after the worker started: sent with the request
    assert worker.run(os.getenv, "TCPY_WORKER_TEST") == "seen"
    monkeypatch.delenv("TCPY_WORKER_TEST")
    assert worker.run(os.getenv, "TCPY_WORKER_TEST", "unset") == "unset"


def test_an_error_in_the_worker_is_raised_here_with_its_message():
    with pytest.raises(tcpy.TCRuntimeError, match="ValueError: invalid literal for int"):
        worker.run(int, "x")
    assert worker.run(int, "7") == 7  # the worker serves on


def test_a_worker_that_ends_is_started_again():
    first = worker.run(os.getpid)
    with pytest.raises(tcpy.TCRuntimeError, match="tcpy's worker process ended"):
        worker.run(os._exit, 3)
    assert worker.run(os.getpid) != first


def test_the_worker_runs_at_the_lowest_cpu_priority():
    # (its compiles must not take cores from the caller's kernels: os.nice(0) reads the niceness)
    before = os.nice(0)
    assert worker.run(os.nice, 0) == 19
    assert os.nice(0) == before  # (the caller's own is left as it was)
