"""nbckpt's errors: grouped by what the user does, with per-process failures as data."""

import pickle

import pytest

import nbckpt.errors as errs
from nbckpt.errors import (
    CallError,
    CheckpointDataError,
    JobError,
    NbckptError,
    PeerError,
    StorageAccessError,
)

# Each current class, its group, and the standard bases callers already catch.
GROUPED = {
    "StepExistsError": (CallError, FileExistsError),
    "CommitRefusedError": (CallError, FileExistsError),
    "RollbackRefusedError": (CallError, ValueError),
    "DisagreementError": (CallError, ValueError),
    "StorageURLError": (CallError, ValueError),
    "RenameUnavailableError": (CallError, ValueError),
    "NoRootError": (CallError, ValueError),
    "BarrierTimeoutError": (PeerError, TimeoutError),
    "PeerFailedError": (PeerError,),
    "PeerDeadError": (PeerError,),
    "PeerTransferError": (PeerError,),
    "StorageError": (StorageAccessError, OSError),
    "RootNotWritableError": (StorageAccessError, PermissionError),
    "CorruptCheckpointError": (CheckpointDataError, ValueError),
    "StepNotFoundError": (CheckpointDataError, FileNotFoundError),
    "ForeignEntryError": (CheckpointDataError, FileExistsError),
    "StepBusyError": (CheckpointDataError, FileExistsError),
    "CheckpointError": (JobError,),
    "ClusterError": (JobError,),
    "ClusterGoneError": (errs.ClusterError,),
    "SaveFailedError": (errs.ClusterError,),
}


def test_every_class_sits_under_one_group_and_keeps_its_standard_base():
    classes = {n for n in errs.__all__ if isinstance(getattr(errs, n), type)} - {"NbckptError"}
    classes -= {g.__name__ for g in errs.GROUPS}
    assert classes == set(GROUPED)
    for name, bases in GROUPED.items():
        cls = getattr(errs, name)
        for base in bases:
            assert issubclass(cls, base), (name, base)
        assert sum(issubclass(cls, g) for g in errs.GROUPS) == 1, name
    for group in errs.GROUPS:
        assert group.__bases__ == (NbckptError,) and group.__doc__


def test_every_class_is_known_by_its_public_path():
    for name in (*errs.__all__, *(g.__name__ for g in errs.GROUPS)):
        obj = getattr(errs, name)
        if isinstance(obj, type):
            assert obj.__module__ == "nbckpt.errors", name
            assert pickle.loads(pickle.dumps(obj)) is obj


def test_peer_errors_carry_each_process_cause_and_keep_their_message():
    e = errs.PeerFailedError(2, "disk full")
    assert str(e) == "process 2 failed: disk full" and e.failures == {2: "disk full"}
    e = errs.PeerFailedError(1, "A", failures={1: "A", 3: "B"})
    assert str(e) == "process 1 failed: A" and e.failures == {1: "A", 3: "B"}
    e = errs.BarrierTimeoutError("nbckpt/op/tmp_ready", [3, 1], 2.0)
    assert sorted(e.failures) == [1, 3] and "did not arrive" in e.failures[1]
    e = errs.PeerDeadError([1, 2], "write", 3.0, unreachable={2: "hung"})
    assert e.failures == {1: "died", 2: "hung"}
    e = errs.PeerTransferError("h:1", "fetch of 'a'", "peer answered missing: a", missing=["a"])
    assert str(e) == "peer h:1: fetch of 'a' failed: peer answered missing: a"
    back = pickle.loads(pickle.dumps(e))
    assert (str(back), back.missing, back.address) == (str(e), ["a"], "h:1")


def test_job_errors_carry_failures():
    e = errs.CheckpointError("op1", 4, 0, "write", "OSError: full")
    assert e.failures == {0: "OSError: full"}
    assert str(e).startswith("save of step 4 (op1) failed on process 0 during write: OSError")
    e = errs.CheckpointError("op1", 4, 0, "write", "process 2 failed: x", failures={2: "x"})
    assert e.failures == {2: "x"}
    e = errs.ClusterError("m", [1], causes={1: "StepExistsError: ..."})
    assert e.failures == e.causes == {1: "StepExistsError: ..."}
    assert errs.ClusterError("m").failures == {}
    assert errs.ClusterGoneError().failures.keys() == {0}
    assert isinstance(errs.SaveFailedError("m", [0], causes={0: "x"}), JobError)


def test_cluster_error_from_failures_is_errors_by_process():
    from nbckpt.session.cluster import errors_by_process

    failures = {0: "A", 1: "A", -1: "B"}
    built = errs.ClusterError.from_failures("save", failures)
    today = errors_by_process("save", failures)
    assert (str(built), built.processes, built.failures) == (
        str(today),
        today.processes,
        today.causes,
    )
    assert built.processes == [0, 1]
    assert type(errs.SaveFailedError.from_failures("save", {2: "x"})) is errs.SaveFailedError


@pytest.mark.parametrize("group", [CallError, PeerError, StorageAccessError, CheckpointDataError])
def test_groups_are_caught_as_nbckpt_errors(group):
    with pytest.raises(NbckptError):
        raise group("x")
