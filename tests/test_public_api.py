import subprocess
import sys

import nbckpt
import nbckpt.engine


def test_engine_public_names_are_pinned():
    assert set(nbckpt.engine.__all__) == {
        "AsyncCheckpointer",
        "CheckpointerOptions",
        "CoordinationServiceClient",
        "InProcessClient",
        "SavePolicy",
        "SignalingClient",
        "Synchronizer",
        "TrainingCheckpointer",
        "all_steps",
        "default_client",
        "latest_step",
    }
    for name in nbckpt.engine.__all__:
        assert getattr(nbckpt.engine, name).__doc__, name


def test_top_level_public_names_are_pinned():
    assert set(nbckpt.__all__) == {
        "BarrierTimeoutError",
        "CallError",
        "CheckpointDataError",
        "JobError",
        "PeerError",
        "StorageAccessError",
        "CheckpointError",
        "ClusterError",
        "ClusterGoneError",
        "CommitRefusedError",
        "CorruptCheckpointError",
        "DisagreementError",
        "ForeignEntryError",
        "NbckptError",
        "NoRootError",
        "PeerDeadError",
        "PeerFailedError",
        "PeerTransferError",
        "RenameUnavailableError",
        "RollbackRefusedError",
        "RootNotWritableError",
        "SaveFailedError",
        "StepBusyError",
        "StepExistsError",
        "StepNotFoundError",
        "StorageError",
        "StorageURLError",
        "__version__",
        "all_steps",
        "latest_step",
    }


def _imported_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys\nprint(' '.join(sorted(sys.modules)))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return set(out.split())


def test_notebook_side_modules_do_not_import_jax():
    # Importing is not all: tests/test_kernel_imports.py also drives a real cluster.
    mods = _imported_after(
        "import nbckpt, nbckpt.session, nbckpt.magics, nbckpt.formats.inventory, "
        "nbckpt.formats.fsck, nbckpt.server, nbckpt.protocol, nbckpt.journal, "
        "nbckpt.formats.layout, nbckpt.cluster, nbckpt.client, "
        "nbckpt.errors, nbckpt.procgroup, nbckpt.views.monitor, nbckpt.widgets, "
        "nbckpt.widgets.progress, nbckpt.widgets.live, nbckpt.widgets.timeline, "
        "nbckpt.widgets.text, nbckpt.widgets.runs, nbckpt.widgets.palette"
    )
    assert not {"jax", "tensorstore", "nbckpt.engine"} & mods


def test_widgets_public_names_are_pinned_and_imported_lazily():
    import nbckpt.views.monitor
    import nbckpt.widgets

    assert set(nbckpt.widgets.__all__) == {
        "ProgressWidget",
        "TextProgress",
        "plot_timeline",
        "watch",
        "watch_runs",
    }
    for name in nbckpt.widgets.__all__:
        assert getattr(nbckpt.widgets, name).__doc__, name
    assert set(nbckpt.views.monitor.__all__) == {
        "BarrierView",
        "JournalTailer",
        "OperationView",
        "ProcessView",
        "barrier_report_view",
        "settled",
        "view_state",
    }
    mods = _imported_after("import nbckpt.widgets")
    assert not {"anywidget", "matplotlib", "tqdm"} & mods


def test_engine_does_not_import_ipython():
    mods = _imported_after(
        "import nbckpt.engine, nbckpt.engine.remote.agent, nbckpt.engine.sync.process"
    )
    assert not {"IPython", "ipyparallel", "ipywidgets"} & mods


def test_every_error_is_one_hierarchy_under_nbckpt_error():
    import nbckpt.errors

    for name in nbckpt.errors.__all__:
        obj = getattr(nbckpt.errors, name)
        if isinstance(obj, type):
            assert issubclass(obj, nbckpt.NbckptError), name
            assert getattr(nbckpt, name) is obj, f"nbckpt.{name} is not exported"


def test_old_import_paths_still_work_for_one_release():
    # Users wrote these before the session/ folder existed; they re-export, not copy.
    import nbckpt.client
    import nbckpt.cluster
    import nbckpt.engine
    import nbckpt.session

    assert nbckpt.cluster.JaxCluster is nbckpt.session.JaxCluster
    assert nbckpt.client.CheckpointClient is nbckpt.session.CheckpointClient
    assert nbckpt.engine.AsyncCheckpointer.__module__ == "nbckpt.engine.checkpointer"
    # The session is the magics' one door into nbckpt: it also names where a root lives
    # and the retention policy, which the magics parse.
    assert set(nbckpt.session.__all__) == {
        "CheckpointClient",
        "JaxCluster",
        "RetentionPolicy",
        "SaveHandle",
        "check_metrics",
        "location",
    }


def test_async_checkpointer_public_methods_are_pinned(tmp_path):
    # Its work moved to collaborators (engine/context.py, reader.py, restore_entry.py,
    # save/start.py, save/inflight.py); its public face did not change.
    import inspect

    from nbckpt.engine import AsyncCheckpointer

    signatures = {
        name: str(inspect.signature(getattr(AsyncCheckpointer, name)))
        for name in dir(AsyncCheckpointer)
        if not name.startswith("_") and callable(getattr(AsyncCheckpointer, name))
    }
    assert signatures == {
        "check_for_errors": "(self) -> 'None'",
        "close": "(self) -> 'None'",
        "in_flight": "(self) -> 'bool'",
        "prune_after": (
            "(self, step: 'int', *, timeout_s: 'float | None' = None, key: 'str | None' = None)"
            " -> 'list[int]'"
        ),
        "reached_preemption": "(self, step: 'int') -> 'bool'",
        "restore": "(self, step: 'int | None' = None, target: 'Any' = None, *, "
        "key: 'str | None' = None, timeout_s: 'float | None' = None, cast: 'bool' = False, "
        "item: 'str | None' = None, partial: 'bool' = False) -> 'Any'",
        "restore_from": "(self, get_target: 'Callable[[], Any]', step: 'int | None' = None, *, "
        "key: 'str | None' = None, timeout_s: 'float | None' = None, cast: 'bool' = False, "
        "item: 'str | None' = None, partial: 'bool' = False) -> 'Any'",
        "save": "(self, step: 'int', tree: 'Any', *, force: 'bool' = False, "
        "key: 'str | None' = None, mode: 'Mode | None' = None, "
        "timeout_s: 'float | None' = None, metrics: 'Mapping[str, Any] | None' = None, "
        "format: 'str | None' = None, persistent: 'bool | None' = None, "
        "pack_bytes: 'int | None' = None) -> 'None'",
        "save_from": "(self, get_tree: 'Callable[[], Any]', step: 'int', *, force: 'bool' = False, "
        "key: 'str | None' = None, mode: 'Mode | None' = None, "
        "timeout_s: 'float | None' = None, metrics: 'Mapping[str, Any] | None' = None, "
        "format: 'str | None' = None, persistent: 'bool | None' = None, "
        "pack_bytes: 'int | None' = None) -> 'None'",
        "set_retention": "(self, policy: 'RetentionPolicy') -> 'None'",
        "set_tiers": "(self, *, local_dir: 'str | os.PathLike[str] | None' = None, "
        "local_replicas: 'int' = 1, persistent_every: 'int' = 1, local_keep: 'int' = 2) -> 'None'",
        "should_save": "(self, step: 'int') -> 'bool'",
        "wait_until_finished": "(self) -> 'None'",
    }
    ckptr = AsyncCheckpointer(tmp_path)
    assert {"process_index", "process_count", "root", "options", "last_op"} <= set(dir(ckptr))
