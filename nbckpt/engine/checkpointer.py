"""AsyncCheckpointer: a short blocking snapshot, then a background multihost commit."""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from nbckpt.engine import health, hooks
from nbckpt.engine import restore as _restore
from nbckpt.engine.snapshot import Snapshot, take_snapshot
from nbckpt.engine.sync import SignalingClient, Synchronizer, default_client, next_sequence
from nbckpt.engine.tree import flatten
from nbckpt.engine.writer import create_arrays, write_shards
from nbckpt.errors import (
    CheckpointError,
    NbckptError,
    PeerDeadError,
    PeerFailedError,
    RootNotWritableError,
    StepExistsError,
    StepNotFoundError,
)
from nbckpt.journal import JournalWriter
from nbckpt.layout import (
    CHECKSUMS_DIR,
    COMMIT_FILE,
    DELETING_SUFFIX,
    METADATA_FILE,
    Mode,
    all_steps,
    fsync_dir,
    fsync_tree_dirs,
    is_complete,
    latest_step,
    step_dir,
    tmp_dir,
)

__all__ = ["AsyncCheckpointer", "CheckpointerOptions"]

FORMAT = "nbckpt/1"


@dataclass(frozen=True, kw_only=True)
class CheckpointerOptions:
    """How an :class:`AsyncCheckpointer` commits.

    Attributes
    ----------
    mode
        ``"rename"``: write into ``<step>.nbckpt-tmp`` and rename it to ``<step>``.
        ``"commit_file"``: write into ``<step>`` and mark it complete with a
        commit-success file, for stores whose rename is not atomic.
    primary
        The process that creates directories, finalizes and applies retention.
    timeout_s
        Deadline of every barrier and agreement, in seconds.
    max_to_keep
        Keep at most this many complete steps (the newest); None keeps all.
    """

    mode: Mode = "rename"
    primary: int = 0
    timeout_s: float = 300.0
    max_to_keep: int | None = None


def _check_step(step: object) -> int:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative int, got {step!r}")
    return step


def _new_op_id(kind: str, step: int) -> str:
    now = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%f")
    return f"{now}-{kind}-{step}"


def _write_durable(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


_ADVICE = (
    (
        ("No space left", "ENOSPC", "errno 28"),
        "the disk holding {root} is full: free space or save to another directory",
    ),
    (
        ("Permission denied", "EACCES", "Read-only file system", "EROFS"),
        "a file or directory under {root} is not writable: fix its permissions",
    ),
    (
        ("No such file or directory", "ENOENT", "does not exist"),
        "a directory under {root} vanished during the save: check what removed it, then save again",
    ),
)


# tensorstore appends its whole JSON spec to errors; the path is already in the text.
_TS_SPEC = re.compile(r"\s*\[tensorstore_spec='.*'\]", re.DOTALL)


def _advice(reason: str, root: Path) -> str:
    """Say what to do about a storage error, from its text (tensorstore wraps errno)."""
    for needles, advice in _ADVICE:
        if any(n in reason for n in needles):
            return "; " + advice.format(root=root)
    return ""


def _probe_writable(root: Path, process: int) -> None:
    root.mkdir(parents=True, exist_ok=True)
    probe = root / f".nbckpt-probe-{process}-{uuid.uuid4().hex[:8]}"
    probe.write_bytes(b"")
    probe.unlink()


class AsyncCheckpointer:
    """Save and restore pytrees of ``jax.Array`` from every process of a JAX job.

    ``save`` returns once the state is safe to keep training on; the write, the
    barriers and the atomic commit run on a background thread. Every process of the
    job must make the same calls in the same order.

    Parameters
    ----------
    root
        The checkpoint root, a directory every process can write (shared storage when
        the processes run on several hosts).
    mode, primary, timeout_s, max_to_keep
        See :class:`CheckpointerOptions`.
    client
        The key-value client used for barriers; by default the coordination service
        of ``jax.distributed``, or an in-process one for a single process.

    Examples
    --------
    >>> ckptr = AsyncCheckpointer("/tmp/ckpt")          # doctest: +SKIP
    >>> ckptr.save(10, {"params": params})              # doctest: +SKIP
    >>> ckptr.wait_until_finished()                     # doctest: +SKIP
    >>> state = ckptr.restore(target={"params": shardings})  # doctest: +SKIP
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        mode: Mode = "rename",
        primary: int = 0,
        timeout_s: float = 300.0,
        max_to_keep: int | None = None,
        client: SignalingClient | None = None,
    ) -> None:
        if mode not in ("rename", "commit_file"):
            raise ValueError(f"mode must be 'rename' or 'commit_file', got {mode!r}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
        if max_to_keep is not None and max_to_keep < 1:
            raise ValueError(f"max_to_keep must be at least 1 or None, got {max_to_keep!r}")
        self.root = Path(os.path.abspath(os.fspath(root)))
        self.options = CheckpointerOptions(
            mode=mode, primary=primary, timeout_s=timeout_s, max_to_keep=max_to_keep
        )
        kv = client if client is not None else default_client()
        self._health = health.monitor_for(kv)
        self._sync = Synchronizer(kv, health=self._health.check)
        n = self._sync.process_count
        if not 0 <= primary < n:
            raise ValueError(f"primary must be a process index in 0..{n - 1}, got {primary}")
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._stale_keys: list[str] = []
        #: The id of the last operation this checkpointer started (its journal folder).
        self.last_op: str | None = None

    # -- public API ------------------------------------------------------------------

    @property
    def process_index(self) -> int:
        """This process's index."""
        return self._sync.process_index

    @property
    def process_count(self) -> int:
        """The number of processes in the job."""
        return self._sync.process_count

    def save(self, step: int, tree: Any, *, force: bool = False, key: str | None = None) -> None:
        """Start saving ``tree`` as ``step``; return once the snapshot is safe.

        Parameters
        ----------
        step
            A non-negative int; the step directory is ``<root>/<step>``.
        tree
            A pytree whose leaves are ``jax.Array`` (sharded across processes,
            replicated, or mixed), NumPy arrays or Python numbers. NumPy arrays and
            process-local jax arrays must hold the same values on every process: the
            primary writes them.
        force
            Replace ``step`` if it is already committed.
        key
            A string unique to this call and the same on every process (a driver such
            as the notebook client passes one). Without it, calls are matched across
            processes by their order, so every process must make the same calls.

        Raises
        ------
        StepExistsError
            ``step`` is already committed and ``force`` is False.
        RootNotWritableError
            Some process cannot write the root; nothing was written.
        TypeError
            A leaf is of an unsupported type; the message names its tree path.
        CheckpointError
            The previous save failed in the background (raised once).
        """
        t_requested = time.time()
        self._check_open()
        self.wait_until_finished()
        step = _check_step(step)
        leaves = flatten(tree)
        op = self._preflight("save", step, force=force, key=key)
        me, n = self.process_index, self.process_count
        journal = JournalWriter(self.root, op, me, "save", step)
        journal.emit(
            "requested",
            t=t_requested,
            process_count=n,
            primary=self.options.primary,
            mode=self.options.mode,
        )
        try:
            hooks.fire("snapshot")
            snap = take_snapshot(leaves, process=me, process_count=n, primary=self.options.primary)
        except BaseException as e:
            # Journal before telling the peers, so the cause is the first failure on record.
            journal.emit("failed", error=f"{type(e).__name__}: {e}", phase="snapshot")
            self._sync.signal_failure(op, f"{type(e).__name__}: {e} (during snapshot)")
            raise
        journal.emit("snapshot_done", bytes=snap.nbytes)
        self.last_op = op
        self._thread = threading.Thread(
            target=self._background,
            args=(op, step, snap, journal, force, t_requested),
            name=f"nbckpt-save-{step}",
            daemon=True,
        )
        self._thread.start()

    def wait_until_finished(self) -> None:
        """Block until the save in flight, if any, is committed or failed.

        Raises
        ------
        CheckpointError
            If that save failed (the error is then cleared).
        """
        thread = self._thread
        if thread is not None:
            thread.join()
            self._thread = None
        self.check_for_errors()

    def check_for_errors(self) -> None:
        """Raise the error of a failed background save, once; return otherwise."""
        with self._lock:
            error, self._error = self._error, None
        if error is not None:
            raise error

    def in_flight(self) -> bool:
        """Tell whether a save is still running in the background."""
        return self._thread is not None and self._thread.is_alive()

    def restore(
        self, step: int | None = None, target: Any = None, *, key: str | None = None
    ) -> Any:
        """Read a complete step back, each process reading only what it needs.

        Parameters
        ----------
        step
            The step to read; None means the latest complete step.
        target
            None to restore every leaf (jax arrays get their saved mesh layout when the
            device count allows, or are replicated otherwise); or a pytree whose
            leaves are ``jax.ShapeDtypeStruct`` with a sharding, ``jax.sharding``
            objects or ``jax.Array`` (restored as jax arrays with that sharding), or
            anything else (restored as host values). A target that covers a subtree
            restores that subtree only. The process count and mesh may differ from
            those at save time.
        key
            As for :meth:`save`.

        Returns
        -------
        The restored pytree, shaped like ``target`` (or as nested dicts and lists).

        Raises
        ------
        StepNotFoundError
            The step is not complete under the root; the message lists those that are.
        """
        self._check_open()
        self.wait_until_finished()
        if step is None:
            step = latest_step(self.root)
            if step is None:
                raise StepNotFoundError(str(self.root), None, [])
        else:
            step = _check_step(step)
            if not is_complete(step_dir(self.root, step)):
                raise StepNotFoundError(str(self.root), step, all_steps(self.root))
        op = self._preflight("restore", step, force=False, key=key)
        journal = JournalWriter(self.root, op, self.process_index, "restore", step)
        journal.emit("requested", process_count=self.process_count)
        try:
            result = _restore.restore_step(step_dir(self.root, step), target, journal)
        except BaseException as e:
            journal.emit("failed", error=f"{type(e).__name__}: {e}", phase="read")
            raise
        journal.emit("restored")
        self.last_op = op
        return result

    def close(self) -> None:
        """Wait for the save in flight and stop accepting calls.

        Raises
        ------
        CheckpointError
            If the last save failed.
        """
        if self._closed:
            return
        try:
            self.wait_until_finished()
        finally:
            self._closed = True

    def __enter__(self) -> AsyncCheckpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the protocol ----------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise NbckptError("this checkpointer is closed; create a new AsyncCheckpointer")

    def _preflight(self, kind: str, step: int, *, force: bool, key: str | None) -> str:
        """Agree on an operation id and check, on every process, that it can go ahead.

        The check happens before anyone writes, and every process raises the same
        error, so a bad root or an existing step never leaves a half-started save.
        """
        seq = f"key-{key}" if key is not None else f"seq{next_sequence()}"
        me = self.process_index
        problem: dict[str, str] = {}
        if kind == "save":
            try:
                _probe_writable(self.root, me)
            except OSError as e:
                problem = {"kind": "root", "reason": e.strerror or str(e)}
            if not problem and me == self.options.primary and not force:
                final = step_dir(self.root, step)
                if is_complete(final):
                    problem = {"kind": "exists", "path": str(final)}
        mine = {"problem": problem}
        if me == self.options.primary:
            mine["op"] = _new_op_id(kind, step)  # type: ignore[assignment]
        answers = self._sync.gather(
            seq, "preflight", json.dumps(mine), timeout_s=self.options.timeout_s
        )
        # Everyone has passed the keys of earlier operations: the primary drops them.
        if me == self.options.primary:
            for key in self._stale_keys:
                self._sync.cleanup(key)
            self._stale_keys.clear()
        self._stale_keys.append(seq)
        parsed = {p: json.loads(v) for p, v in sorted(answers.items())}
        for p, answer in parsed.items():
            prob = answer.get("problem") or {}
            if prob.get("kind") == "root":
                raise RootNotWritableError(str(self.root), p, prob["reason"])
            if prob.get("kind") == "exists":
                raise StepExistsError(prob["path"])
        op = str(parsed[self.options.primary]["op"])
        self._stale_keys.append(op)
        return op

    def _barrier(self, journal: JournalWriter, op: str, name: str) -> None:
        journal.emit("barrier_enter", name=name)
        self._sync.barrier(op, name, timeout_s=self.options.timeout_s)
        journal.emit("barrier_exit", name=name)

    def _background(
        self,
        op: str,
        step: int,
        snap: Snapshot,
        journal: JournalWriter,
        force: bool,
        t_requested: float,
    ) -> None:
        me = self.process_index
        primary = me == self.options.primary
        final = step_dir(self.root, step)
        work = tmp_dir(self.root, step) if self.options.mode == "rename" else final
        phase = "prepare"

        def enter(name: str) -> None:
            nonlocal phase
            phase = name
            hooks.fire(name)

        try:
            enter("prepare")
            if primary:
                self._prepare(work, final, snap)
            enter("barrier:tmp_ready")
            self._barrier(journal, op, "tmp_ready")
            journal.emit("tmp_ready")
            enter("write")
            journal.emit("write_started", bytes=snap.nbytes)

            def watch() -> None:
                # A long write still gives up soon after a peer dies or fails.
                self._health.check("write")
                self._sync.check_failures(op)

            checksums: dict[str, dict[str, int]] = {}
            written = write_shards(
                work,
                snap,
                progress=lambda b: journal.emit("write_progress", bytes=b),
                watch=watch,
                checksums=checksums,
            )
            sums = work / CHECKSUMS_DIR
            sums.mkdir(exist_ok=True)
            _write_durable(sums / f"process_{me}.json", json.dumps(checksums))
            journal.emit("write_done", bytes=written)
            enter("barrier:write_complete")
            self._barrier(journal, op, "write_complete")
            if primary:
                enter("finalize")
                journal.emit("finalize_started")
                self._finalize(work, final, snap, op, step, t_requested, force)
                journal.emit("finalized")
            enter("barrier:commit_complete")
            self._barrier(journal, op, "commit_complete")
            journal.emit("committed")
            if primary and self.options.max_to_keep is not None:
                phase = "retention"
                self._apply_retention(self.options.max_to_keep)
        except BaseException as e:
            reason = str(e) if isinstance(e, NbckptError) else f"{type(e).__name__}: {e}"
            reason = _TS_SPEC.sub("", reason)
            reason += _advice(reason, self.root)
            # Past the finalize, the step may be complete although a peer then failed.
            committed = phase == "barrier:commit_complete" and is_complete(final)
            # Journal before telling the peers, so the cause is the first failure on record.
            journal.emit("failed", error=reason, phase=phase, committed=committed)
            if not isinstance(e, PeerFailedError | PeerDeadError):
                self._sync.signal_failure(op, f"{reason} (during {phase})")
            with self._lock:
                self._error = CheckpointError(op, step, me, phase, reason, committed)
        finally:
            journal.close()

    def _prepare(self, work: Path, final: Path, snap: Snapshot) -> None:
        """Primary only: make an empty working directory with every array created."""
        if work == final:
            # commit_file mode writes in place: an old directory is either incomplete
            # (a failed attempt) or being replaced with force=True. Un-commit it first
            # so no reader takes it for complete while it is removed.
            if final.exists():
                (final / COMMIT_FILE).unlink(missing_ok=True)
                shutil.rmtree(final)
        elif work.exists():
            shutil.rmtree(work)  # left by an abandoned save of the same step
        work.mkdir(parents=True)
        create_arrays(work, snap)

    def _finalize(
        self,
        work: Path,
        final: Path,
        snap: Snapshot,
        op: str,
        step: int,
        t_requested: float,
        force: bool,
    ) -> None:
        """Primary only: write the metadata, make everything durable, publish."""
        meta = {
            "format": FORMAT,
            "step": step,
            "mode": self.options.mode,
            "op": op,
            "process_count": self.process_count,
            "primary": self.options.primary,
            "time_requested": t_requested,
            "time_finalized": time.time(),
            "leaves": snap.leaves,
        }
        _write_durable(work / METADATA_FILE, json.dumps(meta, indent=1))
        fsync_tree_dirs(work)
        if self.options.mode == "commit_file":
            _write_durable(final / COMMIT_FILE, f"{op}\n")
            fsync_dir(final)
        elif final.exists():
            if not force:
                raise StepExistsError(str(final))
            old = final.with_name(f"{step}{DELETING_SUFFIX}")
            if old.exists():
                shutil.rmtree(old)
            os.rename(final, old)
            os.rename(work, final)
            fsync_dir(self.root)
            shutil.rmtree(old)
        else:
            os.rename(work, final)
        fsync_dir(self.root)

    def _apply_retention(self, keep: int) -> None:
        """Primary only: remove the oldest complete steps beyond ``keep``."""
        steps = all_steps(self.root)
        for step in steps[: max(0, len(steps) - keep)]:
            doomed = step_dir(self.root, step).with_name(f"{step}{DELETING_SUFFIX}")
            os.rename(step_dir(self.root, step), doomed)  # no longer a step, atomically
            fsync_dir(self.root)
            shutil.rmtree(doomed)
