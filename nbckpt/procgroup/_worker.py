"""The worker side of a local process group: ``python -m nbckpt.procgroup._worker``."""

from __future__ import annotations

import argparse
import importlib
import os
import pickle
import traceback
from multiprocessing.connection import Connection
from typing import Any


def _resolve(ref: str) -> Any:
    module, _, name = ref.partition(":")
    obj: Any = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def main(argv: list[str] | None = None) -> None:
    """Initialize JAX in this process, then run the functions the parent sends."""
    parser = argparse.ArgumentParser(prog="nbckpt.procgroup._worker")
    parser.add_argument("--process-id", type=int, required=True)
    parser.add_argument("--num-processes", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--coordinator-host", default="127.0.0.1")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--recoverable", action="store_true")
    args = parser.parse_args(argv)
    conn = Connection(args.fd)
    try:
        # Imported inside the try, so that an import error reaches the parent too.
        from nbckpt.engine.sync import process

        address = f"{args.coordinator_host}:{args.port}"
        process.initialize(
            args.process_id,
            args.num_processes,
            address,
            devices_per_process=args.devices,
            bind_address=address,
            recoverable=args.recoverable,
        )
        conn.send_bytes(pickle.dumps(("ok", os.getpid())))
    except BaseException:
        conn.send_bytes(pickle.dumps(("err", traceback.format_exc())))
        raise
    while True:
        try:
            message = pickle.loads(conn.recv_bytes())
        except EOFError:
            break
        if message is None:
            break
        ref, call_args, call_kwargs = message
        try:
            result = _resolve(ref)(*call_args, **call_kwargs)
            reply = pickle.dumps(("ok", result))
        except BaseException:
            reply = pickle.dumps(("err", traceback.format_exc()))
        conn.send_bytes(reply)
    if args.num_processes > 1:
        process.shutdown()


if __name__ == "__main__":
    main()
