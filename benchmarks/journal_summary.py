"""One save's journal on an object store: what gathering its records into a summary costs.

Run: ``.venv/bin/python benchmarks/journal_summary.py [--processes 16,256,1024] [--reps 3]``

On an object store every process of a save writes its journal record as an object of
its own; once the save has committed, its primary reads them all, writes one summary
object and deletes the records (:mod:`nbckpt.journal._summary`), before its
``wait_until_finished`` returns. This benchmark writes N committed records (about
1.5 KiB each, like a save's) to the local test server (moto, on 127.0.0.1), then times
the reads, the summary's write, the deletes, and the whole of ``summarize``, each on a
fresh set of records. moto answers one request at a time, so the figures are its
request rate more than the client's; a real store answers many at once.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from nbckpt.journal import _summary  # noqa: E402
from nbckpt.storage import location  # noqa: E402
from nbckpt.storage.local_s3 import S3Server  # noqa: E402
from nbckpt.storage.objects import ObjectPath  # noqa: E402

_RECORD = (
    (json.dumps({"event": "barrier_enter", "t": 1.0, "name": "write_complete" + " " * 100}) + "\n")
    * 10
    + json.dumps({"event": "committed", "t": 2.0})
    + "\n"
)


def _records(folder: ObjectPath, n: int) -> None:
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda p: _summary._record(folder, p).write_text(_RECORD), range(n)))


def _parts(folder: ObjectPath, n: int) -> dict[str, float]:
    """The three parts of a summary, timed one after the other."""
    out = {}
    t = time.perf_counter()
    with ThreadPoolExecutor(min(_summary._THREADS, n)) as pool:
        data = list(pool.map(lambda p: _summary._read(folder, p), range(n)))
        out["read"] = time.perf_counter() - t
        t = time.perf_counter()
        (folder / _summary.SUMMARY_FILE).write_bytes(b"".join(d or b"" for d in data))
        out["write"] = time.perf_counter() - t
        t = time.perf_counter()
        list(pool.map(lambda p: _summary._record(folder, p).unlink(missing_ok=True), range(n)))
        out["delete"] = time.perf_counter() - t
    return out


def main(argv: list[str] | None = None) -> int:
    """Time the summary of N records for each N; print one row per N."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", default="16,256,1024")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)
    sizes = [int(n) for n in args.processes.split(",")]
    print("| records | read s | summary write s | delete s | summarize s |")
    print("|---|---|---|---|---|")
    with S3Server() as server:
        server.create_bucket("bench")
        os.environ.update(server.env())
        for n in sizes:
            runs: dict[str, list[float]] = {"read": [], "write": [], "delete": [], "all": []}
            for rep in range(args.reps):
                folder = location(f"s3://bench/parts-{n}-{rep}")
                assert isinstance(folder, ObjectPath)
                _records(folder, n)
                for part, seconds in _parts(folder, n).items():
                    runs[part].append(seconds)
                folder = location(f"s3://bench/whole-{n}-{rep}")
                assert isinstance(folder, ObjectPath)
                _records(folder, n)
                t = time.perf_counter()
                if not _summary.summarize(folder, n):
                    raise SystemExit(f"the summary of {n} records was not written")
                runs["all"].append(time.perf_counter() - t)
                left = folder.list_keys()
                if left != [_summary.SUMMARY_FILE]:
                    raise SystemExit(f"after the summary of {n} records: {left[:5]} ...")
            cells = [
                f"{statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f})" for v in runs.values()
            ]
            print(f"| {n} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
