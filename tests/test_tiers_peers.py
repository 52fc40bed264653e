"""Peers send files to each other, directly (issue 28): real sockets on 127.0.0.1.

Some servers run in this process (threads), the others in a separate Python process,
so that one can be killed mid-transfer the way a host dies.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from nbckpt.engine.tiers.peers import PeerServer, fetch, list_files
from nbckpt.errors import PeerError, PeerTransferError

REPO = Path(__file__).resolve().parent.parent
KEY = b"the job's shared key, 32 bytes.."
# Generous: these tests assert what failed, never how long it took.
DEADLINE_S = 60.0
BIG = 64 << 20

SERVE = """
import sys
from nbckpt.engine.tiers.peers import PeerServer
with PeerServer(sys.argv[1], bytes.fromhex(sys.argv[2]), "127.0.0.1") as server:
    print(server.address, flush=True)
    sys.stdin.read()  # until the test closes it
"""


@contextmanager
def served_elsewhere(root: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A server in a separate Python process; yields the process and its address."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE, str(root), KEY.hex()],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        address = proc.stdout.readline().strip()
        assert address, "the server process did not start"
        yield proc, address
    finally:
        if proc.poll() is None:
            proc.stdin.close()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        proc.stdout.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, bytes]]:
    """A served directory: nested shards, an empty file, a 64 MiB one, and symlinks out."""
    base = tmp_path_factory.mktemp("peers")
    root = base / "root"
    files = {
        "step_4/a.bin": os.urandom(1 << 20),
        "step_4/empty.bin": b"",
        "step_4/nested/deeper/b.bin": b"abc",
        "step_5/c.bin": os.urandom(5000),
        "big.bin": os.urandom(BIG),
    }
    for i in range(40):
        files[f"step_4/shards/{i:03d}.bin"] = os.urandom(i * 4099)
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    outside = base / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("not yours")
    (root / "link_out").symlink_to(outside / "secret.txt")
    (root / "dir_out").symlink_to(outside)
    return root, files


@pytest.fixture(scope="module")
def root(served: tuple[Path, dict[str, bytes]]) -> Path:
    return served[0]


@pytest.fixture(scope="module")
def tree(served: tuple[Path, dict[str, bytes]]) -> dict[str, bytes]:
    return served[1]


@pytest.fixture(scope="module")
def remote(root: Path) -> Iterator[str]:
    with served_elsewhere(root) as (_proc, address):
        yield address


@pytest.fixture
def server(root: Path) -> Iterator[PeerServer]:
    with PeerServer(root, KEY, "127.0.0.1") as s:
        yield s


def files_under(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_a_peer_in_another_process_sends_many_files_bit_for_bit(
    remote: str, tree: dict[str, bytes], tmp_path: Path
) -> None:
    listed = list_files(remote, KEY, "", deadline_s=DEADLINE_S)
    # Symlinks are neither listed nor followed: only what lives under the root.
    assert listed == sorted((rel, len(data)) for rel, data in tree.items())
    seen: list[int] = []
    dest = tmp_path / "dest"
    got = fetch(
        remote, KEY, [rel for rel, _ in listed], dest, deadline_s=DEADLINE_S, progress=seen.append
    )
    assert got == sum(len(d) for d in tree.values())
    assert files_under(dest) == tree  # bit for bit, and no temporary file left
    assert seen == sorted(seen) and seen[-1] == got and len(seen) < got // (1 << 20)


def test_list_names_files_from_the_root_and_a_missing_folder_has_none(
    server: PeerServer, tmp_path: Path
) -> None:
    nested = list_files(server.address, KEY, "step_4/nested", deadline_s=DEADLINE_S)
    assert nested == [("step_4/nested/deeper/b.bin", 3)]
    assert list_files(server.address, KEY, "step_99", deadline_s=DEADLINE_S) == []
    # A fetch into a served directory in progress: its temporary file is not offered.
    with PeerServer(tmp_path, KEY, "127.0.0.1") as mine:
        (tmp_path / "x.bin").write_bytes(b"x")
        (tmp_path / ".y.bin.0123.nbckpt-part").write_bytes(b"half")
        assert list_files(mine.address, KEY, "", deadline_s=DEADLINE_S) == [("x.bin", 1)]


def test_a_wrong_key_gets_nothing_and_the_server_still_serves_others(
    server: PeerServer, tmp_path: Path
) -> None:
    with pytest.raises(PeerTransferError, match="authentication failed") as e:
        fetch(server.address, b"another key", ["step_5/c.bin"], tmp_path, deadline_s=DEADLINE_S)
    assert isinstance(e.value, PeerError) and server.address in str(e.value)
    assert files_under(tmp_path) == {}
    with pytest.raises(PeerTransferError, match="authentication failed"):
        list_files(server.address, b"", "", deadline_s=DEADLINE_S)
    host, port = server.address.split(":")
    with socket.create_connection((host, int(port)), timeout=DEADLINE_S) as raw:
        raw.sendall(b"garbage" * 100)  # no proof at all
    assert fetch(server.address, KEY, ["step_5/c.bin"], tmp_path, deadline_s=DEADLINE_S) == 5000


@pytest.mark.parametrize(
    "rel", ["../x", "step_4/../../x", "/etc/passwd", "link_out", "dir_out/secret.txt"]
)
def test_paths_that_leave_the_served_directory_are_refused(
    server: PeerServer, rel: str, tmp_path: Path
) -> None:
    with pytest.raises(PeerTransferError, match="path refused") as e:
        fetch(server.address, KEY, ["step_5/c.bin", rel], tmp_path, deadline_s=DEADLINE_S)
    assert repr(rel) in str(e.value)
    assert files_under(tmp_path) == {}  # refused before anything was sent
    with pytest.raises(PeerTransferError, match="path refused"):
        list_files(server.address, KEY, rel, deadline_s=DEADLINE_S)


def test_a_missing_file_is_named_and_leaves_no_temporary_file(
    server: PeerServer, tree: dict[str, bytes], tmp_path: Path
) -> None:
    wanted = ["step_4/a.bin", "step_4/gone.bin", "step_5/c.bin"]
    with pytest.raises(PeerTransferError, match=r"missing: step_4/gone\.bin") as e:
        fetch(server.address, KEY, wanted, tmp_path, deadline_s=DEADLINE_S)
    assert e.value.missing == ["step_4/gone.bin"]
    # The files the peer has arrive whole; nothing else is left.
    assert files_under(tmp_path) == {r: tree[r] for r in ("step_4/a.bin", "step_5/c.bin")}


def test_a_peer_killed_mid_transfer_fails_the_fetch_and_leaves_no_partial_file(
    root: Path, tmp_path: Path
) -> None:
    with served_elsewhere(root) as (proc, address):

        def kill_the_peer(_received: int) -> None:
            if proc.poll() is None:
                proc.kill()  # SIGKILL: the host died
                proc.wait()

        with pytest.raises(PeerTransferError) as e:
            fetch(
                address, KEY, ["big.bin"], tmp_path, deadline_s=DEADLINE_S, progress=kill_the_peer
            )
    # It failed on the closed connection, not at the deadline.
    assert "timed out" not in str(e.value)
    assert "closed the connection" in str(e.value) or "reset the connection" in str(e.value)
    assert address in str(e.value) and "'big.bin'" in str(e.value)
    assert list(tmp_path.iterdir()) == []


def test_a_peer_that_accepts_but_never_answers_times_out(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(DEADLINE_S)
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        held: list[socket.socket] = []
        hold = threading.Thread(target=lambda: held.append(listener.accept()[0]))
        hold.start()
        try:
            with pytest.raises(PeerTransferError, match="timed out after 1 s"):
                fetch(address, KEY, ["a"], tmp_path, deadline_s=1.0)
        finally:
            hold.join()
            for conn in held:
                conn.close()
    assert list(tmp_path.iterdir()) == []


def test_nothing_listening_is_refused_and_a_closed_server_stops_listening(
    root: Path, tmp_path: Path
) -> None:
    s = PeerServer(root, KEY, "127.0.0.1")
    assert list_files(s.address, KEY, "step_5", deadline_s=DEADLINE_S) == [("step_5/c.bin", 5000)]
    s.close()
    s.close()  # again: nothing to do
    with pytest.raises(PeerTransferError, match="refused"):
        list_files(s.address, KEY, "step_5", deadline_s=DEADLINE_S)


def test_a_stalled_client_is_dropped_by_the_server(root: Path) -> None:
    with PeerServer(root, KEY, "127.0.0.1", timeout_s=0.5) as s:
        host, port = s.address.split(":")
        with socket.create_connection((host, int(port)), timeout=DEADLINE_S) as raw:
            greeting = raw.recv(64)
            assert greeting.startswith(b"NBPEERS1")
            # We never answer: the server gives up on us and closes the connection.
            while raw.recv(64):
                pass


def test_two_threads_fetching_the_same_files_into_one_dest_both_get_them_whole(
    remote: str, tree: dict[str, bytes], tmp_path: Path
) -> None:
    wanted = [*sorted(r for r in tree if r.startswith("step_4/")), "big.bin"]
    errors: list[BaseException] = []

    def one() -> None:
        try:
            fetch(remote, KEY, wanted, tmp_path, deadline_s=DEADLINE_S)
        except BaseException as e:  # reported below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert files_under(tmp_path) == {r: tree[r] for r in wanted}
