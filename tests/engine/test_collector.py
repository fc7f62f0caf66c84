"""The garbage collector pause around a pass leaves the process as it found it."""

import gc

import pytest

from scheduling.engine.collector import collector_paused


@pytest.fixture(autouse=True)
def _restore_gc():
    was = gc.isenabled()
    yield
    if was:
        gc.enable()
    else:
        gc.disable()


def test_paused_inside_and_enabled_again_after_nested_passes_and_errors():
    gc.enable()
    with collector_paused():
        assert not gc.isenabled()
        with pytest.raises(RuntimeError), collector_paused():
            raise RuntimeError("a pass failed")
        assert not gc.isenabled()  # the outer pass is still running
    assert gc.isenabled()


def test_a_collector_disabled_by_the_process_stays_disabled():
    gc.disable()
    with collector_paused():
        pass
    assert not gc.isenabled()
