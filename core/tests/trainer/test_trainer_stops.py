"""Stop signals: SIGINT/SIGTERM become StopRequested in the main thread, deferred while a checkpoint save holds them.

The signals are real (``os.kill`` of this process); Python runs the handler in the main thread right after.
"""

from __future__ import annotations

import os
import pickle
import signal
import threading

import pytest

from verl.trainer import faults
from verl.trainer.stops import StopRequested, StopSignals, exit_status


@pytest.fixture
def stops():
    signals = StopSignals()
    assert signals.install()
    yield signals
    signals.restore()


def _send(signum: int) -> None:
    os.kill(os.getpid(), signum)
    for _ in range(100):  # the handler runs at the next bytecode boundary; give it a few
        pass


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_raises_stop_requested_with_the_shell_status(stops, signum, status):
    with pytest.raises(StopRequested) as info:
        _send(signum)
    assert info.value.signum == signum and info.value.signame == signal.Signals(signum).name
    assert isinstance(info.value, KeyboardInterrupt)  # not swallowed by `except Exception`
    assert exit_status(signum) == status
    assert pickle.loads(pickle.dumps(info.value)).signum == signum


def test_a_held_stop_waits_for_release_and_says_so(stops, capfd):
    stops.hold("checkpoint global_step_3 is being saved")
    _send(signal.SIGTERM)  # recorded, not raised
    err = capfd.readouterr().err
    assert "SIGTERM received; stopping once checkpoint global_step_3 is being saved" in err
    assert "send it again to stop at once" in err
    with pytest.raises(StopRequested) as info:
        stops.release()
    assert info.value.signum == signal.SIGTERM
    stops.release()  # nothing pending any more: no second raise


def test_a_second_signal_during_a_hold_stops_at_once(stops):
    stops.hold("a save")
    _send(signal.SIGINT)
    with pytest.raises(StopRequested):
        _send(signal.SIGINT)


def test_step_scope_raises_a_deferred_stop_only_when_the_block_succeeded(stops):
    with pytest.raises(StopRequested), stops.step():
        stops.hold("a save")
        _send(signal.SIGINT)
    # The block's own error wins and the pending stop is dropped (the run ends either way).
    with pytest.raises(ZeroDivisionError), stops.step():
        stops.hold("a save")
        _send(signal.SIGINT)
        raise ZeroDivisionError
    with stops.step():  # a clean block without a signal: nothing raised, nothing left held
        stops.hold("a save")
    with pytest.raises(StopRequested):
        _send(signal.SIGINT)  # not held any more: stops at once


def test_restore_puts_back_the_previous_handlers():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signals = StopSignals()
    signals.install()
    signals.install()  # a second install (after ray.init) keeps the first handlers for restore
    assert signal.getsignal(signal.SIGTERM) == signals._handle
    signals.restore()
    assert {s: signal.getsignal(s) for s in before} == before
    assert not signals.installed


def test_install_outside_the_main_thread_does_nothing():
    results = []
    thread = threading.Thread(target=lambda: results.append(StopSignals().install()))
    thread.start()
    thread.join()
    assert results == [False]


def test_fault_injection_sends_the_signal_at_its_stage(stops):
    faults.arm({faults.ENV_VAR: "update_actor:2:sigterm"})
    try:
        faults.check("update_actor", 1)  # another step: nothing
        with pytest.raises(StopRequested) as info:
            faults.check("update_actor", 2)
            for _ in range(100):
                pass
        assert info.value.signum == signal.SIGTERM
    finally:
        faults.arm({})


def test_a_second_signal_mid_save_abandons_that_checkpoint_and_keeps_the_last_one(stops, tmp_path):
    """The trainer holds stops while a checkpoint is written. A first signal waits; a second one stops at once,
    inside the save: the save's own clean-up removes the temp folder and the previous checkpoint stays tracked."""
    from verl.trainer.checkpoint import TRACKER_FILE, CheckpointManager

    manager = CheckpointManager(tmp_path)
    manager.save(1, {"data.pt": {"step": 1}})

    def actor_part(path):
        path.mkdir()
        (path / "weights.bin").write_bytes(b"x" * 1024)
        _send(signal.SIGTERM)  # recorded: the save goes on
        _send(signal.SIGTERM)  # the second: StopRequested, raised inside the write

    stops.hold("checkpoint global_step_2 is saved")
    with pytest.raises(StopRequested):
        manager.save(2, {"actor": actor_part, "data.pt": {"step": 2}})
    stops.discard()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_1", TRACKER_FILE]
    assert (tmp_path / TRACKER_FILE).read_text() == "1"
    assert CheckpointManager(tmp_path).latest() == (1, tmp_path / "global_step_1")
