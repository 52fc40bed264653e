"""IPython magics: ``%load_ext nbckpt``, then ``%ckpt_cluster start -n 4`` and friends.

Each magic parses its arguments (bad ones raise ``UsageError`` with the usage line) and
calls :mod:`nbckpt.client`; there is no protocol logic here.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from nbckpt.client import CheckpointClient, SaveHandle, list_steps
from nbckpt.cluster import JaxCluster
from nbckpt.protocol import PHASES

__all__ = ["NbckptMagics", "get_client", "load_ipython_extension"]

_NO_CLUSTER = "no nbckpt cluster yet: start one with %ckpt_cluster start -n 4 --dir DIR"


def _step(text: str) -> int:
    try:
        step = int(text)
    except ValueError:
        raise UsageError(f"--step takes a whole number, got {text!r}") from None
    if step < 0:
        raise UsageError(f"--step must be 0 or more, got {step}")
    return step


def _positive(value: float, flag: str) -> float:
    if value <= 0:
        raise UsageError(f"{flag} must be positive, got {value:g}")
    return value


@magics_class
class NbckptMagics(Magics):
    """The ``%ckpt_*`` magics. One cluster and one client per IPython session."""

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self.cluster: JaxCluster | None = None
        self.client: CheckpointClient | None = None

    def _client(self) -> CheckpointClient:
        if self.client is None:
            raise UsageError(_NO_CLUSTER)
        return self.client

    def _run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Call the client; turn a bad value into a UsageError, let real errors raise."""
        try:
            return fn(*args, **kwargs)
        except ValueError as e:
            raise UsageError(str(e)) from None

    # -- cluster ---------------------------------------------------------------------

    @magic_arguments()
    @argument(
        "action",
        choices=["start", "stop", "status", "attach", "restart"],
        help="start a new cluster, attach to a running one, show it, stop it, or "
        "restart it with fresh engines",
    )
    @argument("-n", type=int, default=4, help="number of engines / JAX processes (start)")
    @argument("--devices-per-process", type=int, default=1, help="CPU devices per process")
    @argument("--dir", help="default checkpoint directory for the other magics")
    @argument(
        "--coordinator-host",
        default="127.0.0.1",
        help="address of process 0's coordination service (real hosts)",
    )
    @argument("--profile", help="ipyparallel profile (attach)")
    @argument("--cluster-id", help="ipyparallel cluster id (attach)")
    @line_magic
    def ckpt_cluster(self, line: str) -> None:
        """Start, attach to, show or stop the cluster of JAX processes.

        ``start`` launches N ipyparallel engines, joins them with jax.distributed
        (engine i is process i; process 0 hosts the coordination service) and makes
        ``%px`` / ``%%px`` run on all of them.
        """
        args = parse_argstring(self.ckpt_cluster, line)
        if args.action in ("start", "attach"):
            if self.cluster is not None:
                raise UsageError("a cluster is running already; %ckpt_cluster stop it first")
            if args.n < 1 or args.devices_per_process < 1:
                raise UsageError("-n and --devices-per-process must be at least 1")
            if args.action == "start":
                cluster = JaxCluster(
                    n=args.n,
                    devices_per_process=args.devices_per_process,
                    coordinator_host=args.coordinator_host,
                ).start()
            else:
                cluster = JaxCluster.attach(
                    profile=args.profile,
                    cluster_id=args.cluster_id,
                    devices_per_process=args.devices_per_process,
                    coordinator_host=args.coordinator_host,
                )
            self.cluster = cluster
            self.client = CheckpointClient(cluster, args.dir)
            px = cluster.view
            px.block = True  # %px waits for the engines and shows their output
            px.activate()
            t = cluster.timings
            took = f" in {t['ready_s']:.1f} s" if "ready_s" in t else ""
            print(
                f"{len(cluster.engine_ids)} JAX processes ready{took} "
                f"(coordinator {cluster.coordinator}); %px and %%px run on all of them"
                + (f"; checkpoints go to {self.client.directory}" if args.dir else "")
            )
        elif args.action == "stop":
            if self.cluster is None:
                raise UsageError(_NO_CLUSTER)
            seconds = self.cluster.stop()
            self.cluster = self.client = None
            print(f"cluster stopped in {seconds:.1f} s")
        elif args.action == "restart":
            if self.cluster is None:
                raise UsageError(_NO_CLUSTER)
            # A JAX process cannot rejoin a job: every engine is replaced.
            self.cluster.restart()
            self._client().handles.clear()
            self.cluster.view.block = True
            self.cluster.view.activate()
            print(
                f"{len(self.cluster.engine_ids)} fresh JAX processes ready in "
                f"{self.cluster.timings['ready_s']:.1f} s; rebuild or %ckpt_restore your state"
            )
        else:
            if self.cluster is None:
                raise UsageError(_NO_CLUSTER)
            for s in self.cluster.status():
                print(
                    f"process {s['process']}: {s['local_devices']} of {s['devices']} devices, "
                    f"host {s['host']}, pid {s['pid']}"
                )

    # -- checkpoints -----------------------------------------------------------------

    @magic_arguments()
    @argument("var", help="name of the pytree in every engine's namespace")
    @argument("--step", required=True, help="step number (a whole number, 0 or more)")
    @argument("--dir", help="checkpoint directory (default: the cluster's --dir)")
    @argument(
        "--mode",
        choices=["rename", "commit_file"],
        default="rename",
        help="finalize by renaming a temporary directory, or with a commit file",
    )
    @argument("--wait", action="store_true", help="block until the step is committed")
    @argument("--force", action="store_true", help="replace the step if it exists")
    @argument("--timeout", type=float, default=300.0, help="barrier deadline in seconds")
    @argument("--quiet", action="store_true", help="do not show the live per-process progress")
    @line_magic
    def ckpt_save(self, line: str) -> SaveHandle | None:
        """Save VAR from every engine as a step; returns a handle at once.

        The engines take a short snapshot and go on; the write and the commit run in
        the background. ``--wait`` blocks until the step is committed. Unless
        ``--quiet``, a widget shows each process's phase, bytes written, barriers and
        commit, updated by itself from the journal (text bars without widgets).
        """
        args = parse_argstring(self.ckpt_save, line)
        step = _step(args.step)
        _positive(args.timeout, "--timeout")
        client = self._client()
        handle: SaveHandle = self._run(
            client.save,
            args.var,
            step,
            directory=args.dir,
            mode=args.mode,
            force=args.force,
            timeout_s=args.timeout,
        )
        live = None if args.quiet else self._live_view(handle.root, handle.op, text=args.wait)
        if args.wait:
            try:
                rec = handle.wait()
            finally:
                if live is not None:
                    live.close()
            print(
                f"step {step} committed to {handle.root} "
                f"({(rec.end or 0) - (rec.start or 0):.2f} s)"
            )
            return None
        print(
            f"saving step {step} to {handle.root} in the background "
            f"(snapshot took {max(handle.blocked_s) * 1e3:.0f} ms); %ckpt_wait waits for it"
        )
        return handle

    @line_magic
    def ckpt_wait(self, line: str) -> None:
        """Wait for the saves not waited for yet, and say how each ended (or raise its error)."""
        if line.strip():
            raise UsageError("%ckpt_wait takes no arguments")
        records = self._client().wait()
        for rec in records:
            print(f"step {rec.step} committed ({rec.op})")
        if not records:
            print("no save to wait for")

    @magic_arguments()
    @argument("name", help="barrier name; the key is made unique per use")
    @argument("--timeout", type=float, default=60.0, help="deadline in seconds")
    @argument("--processes", help="comma-separated process indices, e.g. 0,2 (default all)")
    @line_magic
    def ckpt_barrier(self, line: str) -> None:
        """Wait at a coordination-service barrier on the engines and show who waited.

        In a notebook, a per-process view shows when each process arrived, whom it is
        still waiting for, and when the barrier released.
        """
        args = parse_argstring(self.ckpt_barrier, line)
        _positive(args.timeout, "--timeout")
        processes = None
        if args.processes:
            try:
                processes = sorted({int(p) for p in args.processes.split(",") if p.strip()})
            except ValueError:
                raise UsageError(
                    f"--processes takes indices like 0,2; got {args.processes!r}"
                ) from None
        client = self._client()
        key = uuid.uuid4().hex[:16]
        journaled = self._barrier_view(client, args.name, key)
        try:
            report = self._run(
                client.barrier, args.name, timeout_s=args.timeout, processes=processes, key=key
            )
        except BaseException:
            self._drop_view_without_journal(key)
            raise
        if not journaled:
            self._show_barrier(report)
        print(report.table())

    @magic_arguments()
    @argument("var", help="name to restore into, in every engine's namespace")
    @argument("--step", default="latest", help="step number, or 'latest' (default)")
    @argument("--dir", help="checkpoint directory (default: the cluster's --dir)")
    @line_magic
    def ckpt_restore(self, line: str) -> None:
        """Restore a step into VAR on every engine, laid out on the engines' current mesh."""
        args = parse_argstring(self.ckpt_restore, line)
        step = None if args.step == "latest" else _step(args.step)
        infos = self._run(self._client().restore, args.var, step, directory=args.dir)
        print(
            f"restored step {infos[0]['step']} into {args.var!r} on {len(infos)} processes "
            f"({max(i['seconds'] for i in infos):.2f} s)"
        )

    @line_magic
    def ckpt_status(self, line: str) -> None:
        """Show the cluster's processes and the saves this notebook started.

        ``%ckpt_status OP [--dir D]`` shows one operation instead: see ``%ckpt_show``.
        """
        if line.strip():
            self.ckpt_show(line)
            return
        st = self._client().status()
        print(f"default directory: {st['directory'] or '(none)'}")
        health = st["health"]
        print("health: " + ", ".join(f"process {p} {h}" for p, h in sorted(health.items())))
        if health and health.get(0) == "dead":
            print(
                "the JAX cluster is gone (process 0 hosted the coordination service): "
                "%ckpt_cluster restart"
            )
        for e in st["engines"]:
            flying = [c["last_op"] for c in e["checkpointers"] if c["in_flight"]]
            print(
                f"process {e['process']}: host {e['host']}, pid {e['pid']}, "
                f"{'saving ' + ', '.join(flying) if flying else 'idle'}"
            )
        for s in st["saves"]:
            print(f"step {s['step']} -> {s['root']}: {s['status']} ({s['op']})")

    @line_magic
    def ckpt_ls(self, line: str) -> None:
        """List the steps in DIR (default: the cluster's --dir)."""
        directory = line.strip() or None
        if directory is None and (self.client is None or self.client.directory is None):
            raise UsageError(
                "%ckpt_ls needs a directory: %ckpt_ls DIR, or start the cluster with --dir"
            )
        root = directory if directory is not None else self._client().root()
        try:
            rows = list_steps(root)
        except FileNotFoundError as e:
            raise UsageError(str(e)) from None
        if not rows:
            print(f"no steps in {root}")
        for r in rows:
            print(f"{r['step']:>8}  {r['state']:<11}  {r['path']}  ({r['reason']})")

    @magic_arguments()
    @argument(
        "action",
        choices=["kill", "stall", "slow-io", "fail-io", "list", "clear"],
        help="what to inject (kill, stall, slow-io, fail-io), or list / clear",
    )
    @argument("--process", type=int, help="the process to act on (not for list / clear)")
    @argument("--at", choices=list(PHASES), help="the phase at which the fault fires")
    @argument("--seconds", type=float, help="how long a stall lasts")
    @argument("--factor", type=float, help="how many times slower slow-io writes")
    @line_magic
    def ckpt_fault(self, line: str) -> None:
        """Inject a fault into one process, for teaching and tests.

        ``kill`` (now, or ``--at`` a phase), ``stall --at PHASE --seconds S``,
        ``slow-io --factor F``, ``fail-io [--at PHASE]`` (an OSError); ``list`` shows
        what is armed, ``clear`` disarms everything. Faults fire at the engine's own
        phase boundaries: snapshot, prepare, barrier:tmp_ready, write,
        barrier:write_complete, finalize, barrier:commit_complete.
        """
        args = parse_argstring(self.ckpt_fault, line)
        client = self._client()
        if args.action not in ("list", "clear") and args.process is None:
            raise UsageError(f"%ckpt_fault {args.action} needs --process P")
        if args.action == "stall" and (args.at is None or not args.seconds or args.seconds <= 0):
            raise UsageError("%ckpt_fault stall needs --at PHASE and --seconds S > 0")
        if args.action == "slow-io" and (args.factor is None or args.factor < 1):
            raise UsageError("%ckpt_fault slow-io needs --factor F >= 1")
        armed = self._run(
            client.fault,
            args.action,
            args.process,
            at=args.at,
            seconds=args.seconds,
            factor=args.factor,
        )
        if args.action == "clear":
            print(f"cleared every fault on processes {', '.join(map(str, sorted(armed)))}")
            return
        for p, faults in sorted(armed.items()):
            print(f"process {p}: {', '.join(faults) if faults else 'no faults'}")

    @magic_arguments()
    @argument("dir", nargs="?", help="checkpoint directory (default: the cluster's --dir)")
    @argument("--clean", action="store_true", help="remove abandoned entries (only those)")
    @argument(
        "--verify",
        action="store_true",
        help="read every array of complete steps and check shapes and checksums",
    )
    @line_magic
    def ckpt_fsck(self, line: str) -> None:
        """Check a checkpoint directory: complete, in progress, abandoned, corrupt.

        ``--clean`` removes abandoned entries and never a complete step; ``--verify``
        recomputes every chunk's checksum recorded at save time.
        """
        from nbckpt.fsck import fsck

        args = parse_argstring(self.ckpt_fsck, line)
        root = args.dir
        if root is None:
            if self.client is None or self.client.directory is None:
                raise UsageError(
                    "%ckpt_fsck needs a directory: %ckpt_fsck DIR, or start the cluster with --dir"
                )
            root = self.client.directory
        try:
            report = fsck(root, clean=args.clean, verify=args.verify)
        except FileNotFoundError as e:
            raise UsageError(str(e)) from None
        print(report.table())

    # -- live views and timelines ------------------------------------------------------

    def _in_kernel(self) -> bool:
        """Whether this shell runs in a kernel whose front end can show widgets."""
        return getattr(self.shell, "kernel", None) is not None

    def _views(self) -> dict[str, Any]:
        """The progress widgets this session made, by operation id (newest last)."""
        views: dict[str, Any] = self.__dict__.setdefault("_progress_views", {})
        return views

    def _live_view(self, root: str, op: str, *, text: bool) -> Any:
        """Show a live view of ``op``; with ``text`` and no widgets, follow it in tqdm bars.

        Returns what must be closed once the caller stops waiting, or None.
        """
        from nbckpt.widgets import watch
        from nbckpt.widgets.text import follow_text

        in_kernel = self._in_kernel()
        self._views()[op] = watch(root, op, display=in_kernel)
        return follow_text(root, op) if text and not in_kernel else None

    def _barrier_view(self, client: CheckpointClient, name: str, key: str) -> bool:
        """In a notebook, follow the barrier's journal (if it has one) while it waits."""
        if not self._in_kernel() or client.directory is None:
            return False
        from nbckpt.widgets import watch

        # The engines name the journal folder <time>-barrier-<key>-<name>.
        self._views()[key] = watch(client.directory, f"*-barrier-{key}-{name}")
        return True

    def _drop_view_without_journal(self, key: str) -> None:
        """Stop following a barrier that failed before any engine journaled it."""
        widget = self._views().get(key)
        if widget is not None and widget.live is not None and widget.live.tailer.event_count == 0:
            widget.live.stop()

    def _show_barrier(self, report: Any) -> None:
        """Show a finished barrier without a journal, from the times the engines sent."""
        if not self._in_kernel():
            return
        from IPython.display import display

        from nbckpt.journal import merge_events
        from nbckpt.monitor import view_state
        from nbckpt.widgets import ProgressWidget

        n = len(report.entered)
        events = {
            p: [
                {"t": t, "event": "requested", "kind": "barrier", "process_count": n},
                {"t": t, "event": "barrier_enter", "name": report.name},
                {"t": report.left[p], "event": "barrier_exit", "name": report.name},
                {"t": report.left[p], "event": "committed"},
            ]
            for p, t in report.entered.items()
        }
        display(ProgressWidget(view_state(merge_events(report.key, events))))

    def _operation(self, op: str | None, directory: str | None) -> tuple[str, str]:
        """Resolve ``(root, op)`` from an op id or folder, --dir, and this session's saves."""
        from nbckpt.journal import list_operations
        from nbckpt.layout import ops_dir

        if op is not None and Path(op).is_dir() and Path(op).parent.name == "ops":
            folder = Path(op).absolute()
            return str(folder.parents[2]), folder.name
        client = self.client
        if directory is not None:
            root = os.path.abspath(directory)
        elif op is None and client is not None and client.handles:
            return client.handles[-1].root, client.handles[-1].op
        elif client is not None and client.directory is not None:
            root = client.directory
        else:
            raise UsageError("which checkpoint directory? pass --dir D (or start the cluster)")
        known = list_operations(root)
        if op is None:
            if not known:
                raise UsageError(f"no journaled operations in {root}")
            op = known[-1]
        if not (ops_dir(root) / op).is_dir():
            latest = ", ".join(known[-3:]) or "none"
            raise UsageError(f"no operation {op!r} in {root}; latest: {latest}")
        return root, op

    @magic_arguments()
    @argument(
        "op",
        nargs="?",
        help="operation id or its journal folder (default: this session's last save, "
        "else the newest operation in the directory)",
    )
    @argument("--dir", help="checkpoint directory (default: the cluster's --dir)")
    @line_magic
    def ckpt_show(self, line: str) -> None:
        """Show one operation's per-process progress, rebuilt from its journal.

        The journal is the source of truth, so this works after a kernel restart
        (pass --dir then). A running operation keeps updating by itself. Without
        widgets, prints one text progress line per process.
        """
        args = parse_argstring(self.ckpt_show, line)
        root, op = self._operation(args.op, args.dir)
        if self._in_kernel():
            from nbckpt.widgets import watch

            self._views()[op] = watch(root, op)
            return
        from nbckpt.monitor import JournalTailer
        from nbckpt.widgets.text import render_text

        print(render_text(JournalTailer(root, op).view()))

    @magic_arguments()
    @argument(
        "op",
        nargs="?",
        help="operation id or its journal folder (default: this session's last save, "
        "else the newest operation in the directory)",
    )
    @argument("--dir", help="checkpoint directory (default: the cluster's --dir)")
    @argument("--save", metavar="FILE.png", help="also write the figure to this PNG file")
    @line_magic
    def ckpt_timeline(self, line: str) -> Any:
        """Draw one operation as a matplotlib figure: a row per process, its phases.

        Barrier waits are hatched with a line where each barrier released; the blocking
        snapshot is shaded apart from the background write; a failed process's last
        phase is outlined in red with its error. Returns the figure.
        """
        args = parse_argstring(self.ckpt_timeline, line)
        if args.save is not None and not args.save.lower().endswith(".png"):
            raise UsageError(f"--save writes PNG: give a file ending in .png, got {args.save!r}")
        root, op = self._operation(args.op, args.dir)
        from nbckpt.widgets import plot_timeline

        fig = plot_timeline(root, op, save=args.save)
        if args.save is not None:
            print(f"timeline of {op} written to {os.path.abspath(args.save)}")
        _show_figures_as_png(self.shell)
        return fig


def get_client() -> CheckpointClient:
    """Return the client behind the magics of this IPython session.

    For going past the magics in a notebook: ``get_client().cluster.view`` is the
    DirectView on every engine, ``get_client().handles`` the saves started so far.

    Raises
    ------
    UsageError
        If no cluster was started with ``%ckpt_cluster``.
    """
    from IPython.core.getipython import get_ipython

    shell = get_ipython()
    magics = shell.magics_manager.registry.get("NbckptMagics") if shell is not None else None
    if magics is None or magics.client is None:
        raise UsageError(_NO_CLUSTER)
    client: CheckpointClient = magics.client
    return client


def _show_figures_as_png(shell: Any) -> None:
    """Let the shell display a returned matplotlib Figure (pyplot may never be imported)."""
    from IPython.core.pylabtools import print_figure
    from matplotlib.figure import Figure

    formatter = shell.display_formatter.formatters["image/png"]
    try:
        formatter.lookup_by_type(Figure)
    except KeyError:
        formatter.for_type(Figure, lambda fig: print_figure(fig, "png", bbox_inches="tight"))


def load_ipython_extension(ipython: Any) -> None:
    """Register the ``%ckpt_*`` magics (``%load_ext nbckpt``)."""
    ipython.register_magics(NbckptMagics)
