"""nbckpt on an object store, side by side with raw tensorstore requests.

Run: ``.venv/bin/python benchmarks/s3.py [--store moto] [--sizes 64M,256M] [--reps 3]``
(``--quick``: 8 MiB, one repetition, a smoke run). The script starts its own server on
127.0.0.1 (the ``dev`` extra has all three): ``moto`` (S3, in memory, Python;
:mod:`nbckpt.storage.local_s3`), ``seaweedfs`` (a real S3 server storing files, Go;
:mod:`nbckpt.storage.local_seaweed`) or ``gcs`` (fake-gcs-server, GCS's JSON API through
``gs://`` roots, Go, in memory; :mod:`nbckpt.storage.local_gcs`).

One group of local JAX processes (one CPU device each) holds one float32 state of 8
arrays sharded over every device (random values) and, in one run, in alternating order
every repetition:

- ``nbckpt``: ``AsyncCheckpointer("s3://bucket/…").save`` (or ``gs://``) timed to the durable commit
  (``wait_until_finished``: commit-object mode, every PUT acknowledged), then a cold
  restore by a fresh ``AsyncCheckpointer`` on every process into the same shardings
  (nbckpt's tensorstore context has no cache, and S3 has no page cache to drop);
- ``raw``: every process PUTs its shards' bytes with ``tensorstore.KvStore.write`` to
  the same bucket under another prefix, one object per shard chunk of at most 64 MiB
  as nbckpt cuts them, all in flight at once, timed to the last acknowledged PUT; then
  GETs them back with ``KvStore.read``, all in flight: the limit of this server.

Each figure is the median over repetitions of the slowest process. The requests each
system sent are counted from moto's log (the other servers log none: n/a). Everything
written is deleted after each run, then the server is stopped (and forgets the
bucket). The last line printed sums up the ratios (nbckpt's time over raw's: 1.00x is
the server's limit).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(HERE), str(REPO)]

from _compare_report import fmt_size, gbps, med, parse_size, ratio, spread  # noqa: E402
from compare import group_of  # noqa: E402

from nbckpt import storage  # noqa: E402
from nbckpt.procgroup import ProcessGroup  # noqa: E402
from nbckpt.storage.local_gcs import GCSServer  # noqa: E402
from nbckpt.storage.local_s3 import S3Server  # noqa: E402
from nbckpt.storage.local_seaweed import SeaweedServer  # noqa: E402
from nbckpt.storage.local_server import LocalServer  # noqa: E402

W = "_workers"
S = "_s3_workers"
SYSTEMS = ("nbckpt", "raw")
#: The servers, what each is, and its URL scheme.
STORES: dict[str, tuple[type[LocalServer], str, str]] = {
    "moto": (S3Server, "moto S3 on 127.0.0.1 (Python, in memory)", "s3"),
    "seaweedfs": (SeaweedServer, "SeaweedFS S3 on 127.0.0.1 (Go, files on local disk)", "s3"),
    "gcs": (GCSServer, "fake-gcs-server on 127.0.0.1 (Go, in memory; gs://)", "gs"),
}

# One request in werkzeug's log: "PUT /bucket/key?query HTTP/1.1" 200
_REQUEST = re.compile(
    r'"(?:\x1b\[[0-9;]*m)*([A-Z]+) (/[^ ]*) HTTP/[0-9.]+(?:\x1b\[[0-9;]*m)*" (\d+)'
)


class RequestLog:
    """Counts the requests the server logged since the last :meth:`take`, by kind.

    moto (werkzeug) logs one line per request after answering it; reading the log
    is outside every timed region. Counts are ``n/a`` if the log cannot be read.
    """

    def __init__(self, server: LocalServer) -> None:
        self.path: Path | None = server.log_path if isinstance(server, S3Server) else None
        self.offset = self._size()

    def _size(self) -> int:
        try:
            return self.path.stat().st_size if self.path else 0
        except OSError:
            return 0

    def take(self) -> collections.Counter[str] | None:
        """The requests logged since the previous call: ``PUT``, ``GET``, ``LIST`` …"""
        if self.path is None:
            return None
        time.sleep(0.2)  # the last lines are written just after the last answers
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return None
        self.offset += len(text.encode("utf-8", "replace"))
        counts: collections.Counter[str] = collections.Counter()
        for method, target, status in _REQUEST.findall(text):
            kind = "LIST" if method == "GET" and "list-type=" in target else method
            counts[kind if status[0] in "23" else f"{kind} {status}"] += 1
        return counts


@dataclass
class Figures:
    """Every repetition's seconds for one size, by system and measure."""

    nbytes: int
    save: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in SYSTEMS})
    restore: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in SYSTEMS})
    # Requests of the last repetition, by system and measure.
    requests: dict[tuple[str, str], collections.Counter[str] | None] = field(default_factory=dict)
    raw_objects: int = 0


def delete(url: str) -> None:
    """Delete every object under ``url``."""
    storage.remove_tree(storage.location(url))


def request_costs(url: str, count: int = 30) -> dict[str, float]:
    """Milliseconds the server takes per small request, one at a time, from this process.

    What each of nbckpt's extra requests (metadata, journal, probes, listings) costs
    on this server, next to the bytes both systems move.
    """
    import tensorstore as ts

    from nbckpt.storage.backend import RETRY_CONTEXT

    prefix = storage.location(f"{url}/request-costs")
    kv = ts.KvStore.open(storage.kvstore_spec(prefix), context=ts.Context(RETRY_CONTEXT)).result()
    costs = {}
    for kind, call in (
        ("PUT", lambda i: kv.write(f"k{i}", b"x" * 100)),
        ("GET", lambda i: kv.read(f"k{i}")),
        ("LIST", lambda i: kv.list()),
    ):
        t0 = time.perf_counter()
        for i in range(count):
            call(i).result()
        costs[kind] = (time.perf_counter() - t0) / count * 1e3
    delete(str(prefix))
    return costs


def bench_size(
    group: ProcessGroup,
    env: dict[str, str],
    url: str,
    requests: RequestLog,
    nbytes: int,
    reps: int,
    log: Callable[[str], None],
) -> Figures:
    """Alternate nbckpt and raw tensorstore on one state, ``reps`` times."""
    built = group.run(f"{W}:build", nbytes)
    fig = Figures(nbytes=built[0]["total"])
    tag = f"s{fig.nbytes}"

    def run_nb(rep: int) -> None:
        root = f"{url}/nb-{tag}-{rep}"
        requests.take()
        out = group.run(f"{S}:nb_save", env, root, rep)
        fig.save["nbckpt"].append(max(float(r["commit"]) for r in out))
        fig.requests["nbckpt", "save"] = requests.take()
        fig.restore["nbckpt"].append(max(group.run(f"{S}:nb_restore", env, root, rep)))
        fig.requests["nbckpt", "restore"] = requests.take()
        delete(root)

    def run_raw(rep: int) -> None:
        prefix = f"{url}/raw-{tag}-{rep}"
        requests.take()
        out = group.run(f"{S}:raw_write", env, prefix, f"{tag}-{rep}")
        fig.save["raw"].append(max(float(r["write"]) for r in out))
        fig.raw_objects = int(sum(r["objects"] for r in out))
        written = int(sum(r["bytes"] for r in out))
        if written != fig.nbytes:
            raise AssertionError(f"raw wrote {written} bytes of a {fig.nbytes}-byte state")
        fig.requests["raw", "save"] = requests.take()
        fig.restore["raw"].append(max(group.run(f"{S}:raw_read", env, prefix, f"{tag}-{rep}")))
        fig.requests["raw", "restore"] = requests.take()
        delete(prefix)

    for rep in range(reps):
        # Alternate which system runs first, so neither always meets a fresh server.
        runners = (run_nb, run_raw) if rep % 2 == 0 else (run_raw, run_nb)
        for run in runners:
            run(rep)
        requests.take()  # the deletions are no system's figure
        log(f"  {fmt_size(fig.nbytes)} rep {rep + 1}/{reps} done")
    return fig


def fmt_requests(counts: collections.Counter[str] | None) -> str:
    """``24 PUT, 3 LIST`` (most first), or n/a."""
    if counts is None:
        return "n/a"
    return ", ".join(f"{n} {kind}" for kind, n in counts.most_common()) or "none"


def report(figures: list[Figures], processes: int, reps: int, server: str) -> list[str]:
    """The Markdown tables."""
    lines = [
        f"### Durable save and cold restore on {server} ({processes} processes, medians of {reps})",
        "",
        "| size | measure | nbckpt | raw tensorstore | nbckpt/raw (time) | "
        "nbckpt's speed / raw's, per repetition |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for f in figures:
        n, z = f.nbytes, fmt_size(f.nbytes)
        for measure, table in (("durable save", f.save), ("cold restore", f.restore)):
            t = {s: med(table[s]) for s in SYSTEMS}
            cells = " | ".join(f"{t[s]:.2f} s = {gbps(n, t[s]):.3f} GB/s" for s in SYSTEMS)
            per_rep = spread(table["raw"], table["nbckpt"])
            lines.append(
                f"| {z} | {measure} | {cells} | {ratio(t['nbckpt'], t['raw'])} | {per_rep} |"
            )
    lines += [
        "",
        "nbckpt/raw is nbckpt's time over raw tensorstore's (1.00x: the server's limit; "
        "higher is slower). The last column pairs the two systems within each repetition "
        "(raw's time over nbckpt's: 1.00x is the limit, lower is slower): median (min-max), "
        "how much this shared machine moved the ratio.",
        "",
        "### Requests the server answered (last repetition)",
        "",
        "| size | measure | nbckpt | raw tensorstore |",
        "| --- | --- | --- | --- |",
    ]
    for f in figures:
        z = fmt_size(f.nbytes)
        for measure in ("save", "restore"):
            lines.append(
                f"| {z} | {measure} | {fmt_requests(f.requests.get(('nbckpt', measure)))} | "
                f"{fmt_requests(f.requests.get(('raw', measure)))} |"
            )
    objects = ", ".join(f"{fmt_size(f.nbytes)}: {f.raw_objects}" for f in figures)
    lines += ["", f"Objects of state written by raw (one per shard chunk): {objects}.", ""]
    return lines


def summary(f: Figures, processes: int, server: str) -> str:
    """The last line: nbckpt's time over raw's, for save and restore."""
    s = ratio(med(f.save["nbckpt"]), med(f.save["raw"]))
    r = ratio(med(f.restore["nbckpt"]), med(f.restore["raw"]))
    return (
        f"SUMMARY ({processes} processes, {fmt_size(f.nbytes)}, {server}): "
        f"save {s} raw, restore {r} raw (time; 1.00x is the server's limit)"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=sorted(STORES), default="moto")
    parser.add_argument("--sizes", default="64M,256M")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="8 MiB, 1 rep: a smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.reps = "8M", 1
    sizes = [parse_size(s) for s in args.sizes.split(",") if s]

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    t0 = time.time()
    figures = []
    left: int | None = None
    costs: dict[str, float] = {}
    bucket = f"nbckpt-bench-{uuid.uuid4().hex[:8]}"
    kind, what, scheme = STORES[args.store]
    url = f"{scheme}://{bucket}"
    server = kind()
    try:
        server.create_bucket(bucket)
        env = server.env()
        os.environ.update(env)  # the parent names the roots too (to delete them)
        costs = request_costs(url)
        requests = RequestLog(server)
        with group_of(args.processes) as group:
            for nbytes in sizes:
                log(f"size {fmt_size(nbytes)}")
                figures.append(bench_size(group, env, url, requests, nbytes, args.reps, log))
            group.run(f"{W}:build", 0, 1)  # let go of the state
        found = storage.location(url)
        assert isinstance(found, storage.ObjectPath)
        left = len(found.list_keys())
    finally:
        server.stop()  # and with it the bucket: every server here forgets it
    cli = argv if argv is not None else sys.argv[1:]
    command = " ".join(["benchmarks/s3.py", *cli])
    print(f"# nbckpt vs raw tensorstore on {args.store} (`{command}`)")
    print(
        f"{os.cpu_count()} cores; {what}: absolute figures are this server's limit on "
        f"this machine, the ratios are what matter; {(time.time() - t0) / 60:.1f} minutes"
    )
    print()
    print("\n".join(report(figures, args.processes, args.reps, args.store)))
    print(
        "One small request (100 bytes), one at a time: "
        + ", ".join(f"{kind} {ms:.1f} ms" for kind, ms in costs.items())
        + "."
    )
    print(f"Objects left in the bucket before stopping the server: {left}.")
    print(summary(figures[-1], args.processes, args.store))
    return 0 if left == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
