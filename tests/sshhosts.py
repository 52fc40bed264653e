"""An sshd on every test host, with keys made for the test, and the ssh config to use them.

:class:`SSHHosts` turns :class:`~tests.testhosts.TestHosts` (made with ``gateway=True``)
into hosts a notebook reaches the way it reaches real ones: by ``ssh h0``. Each host
runs Debian's ``sshd`` (the ``host-deps`` make target installs it) on its own address,
in its own mount namespace, with its own host name. The keys, ``known_hosts`` and the
client's config live in a directory of the test's; nothing under ``~/.ssh`` is read or
written.

With ``storage=DIR``, every host sees ``DIR`` at :data:`HOST_STORAGE` through a bind
mount in its own namespace, as cluster hosts see a shared file system that the
notebook's machine does not mount: here the kernel has no ``/srv/ckpt`` at all.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Self

from tests.testhosts import TestHosts

__all__ = ["HOST_STORAGE", "SSHHosts", "unavailable"]

SSHD = "/usr/sbin/sshd"
#: Where each host sees the shared storage (under a tmpfs of its own over /srv).
HOST_STORAGE = "/srv/ckpt"


def unavailable() -> str | None:
    """Why sshd test hosts cannot run here, or None if they can."""
    if not Path(SSHD).exists() or shutil.which("ssh") is None:
        return "sshd test hosts need openssh-server and openssh-client (make host-deps)"
    return None


def _keygen(path: Path) -> str:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "nbckpt-test", "-f", str(path)],
        check=True,
    )
    return path.with_suffix(".pub").read_text().strip()


class SSHHosts:
    """sshd on each of ``hosts``, reachable from here as ``ssh -F config h<i>``.

    Parameters
    ----------
    hosts
        Test hosts made with ``gateway=True`` (this machine must reach them).
    workdir
        A directory of the test's for keys, configs and the sshd logs.
    storage
        A directory every host sees at :data:`HOST_STORAGE` (and the kernel does not).
    """

    __test__ = False  # a fixture, not a test class

    def __init__(self, hosts: TestHosts, workdir: Path, *, storage: Path | None = None) -> None:
        why = unavailable()
        if why is not None:
            raise RuntimeError(why)
        if hosts.gateway is None:
            raise ValueError("SSHHosts needs TestHosts(..., gateway=True)")
        self.hosts = hosts
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.config = self.dir / "ssh_config"
        self._procs: list[subprocess.Popen[bytes]] = []
        try:
            self._start(storage)
        except BaseException:
            self.close()
            raise

    def _start(self, storage: Path | None) -> None:
        client_key = self.dir / "id_ed25519"
        (self.dir / "authorized_keys").write_text(_keygen(client_key) + "\n")
        host_key = self.dir / "host_ed25519"
        host_pub = _keygen(host_key)
        known, client = [], []
        for h in self.hosts.hosts:
            known.append(f"{h.name},{h.address} {host_pub}")
            client.append(f"Host {h.name}\n  HostName {h.address}\n")
        (self.dir / "known_hosts").write_text("\n".join(known) + "\n")
        client.append(
            "Host *\n"
            "  User root\n"
            f"  IdentityFile {client_key}\n"
            "  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {self.dir / 'known_hosts'}\n"
            "  StrictHostKeyChecking yes\n"
            "  BatchMode yes\n"
            "  ConnectTimeout 10\n"
            "  LogLevel ERROR\n"
        )
        self.config.write_text("".join(client))
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation
        for h in self.hosts.hosts:
            conf = self.dir / f"sshd_{h.name}.conf"
            conf.write_text(
                f"ListenAddress {h.address}\n"
                "Port 22\n"
                f"HostKey {host_key}\n"
                f"AuthorizedKeysFile {self.dir / 'authorized_keys'}\n"
                "PermitRootLogin prohibit-password\n"
                "PasswordAuthentication no\n"
                "KbdInteractiveAuthentication no\n"
                "UsePAM no\n"
                "StrictModes no\n"
                f"PidFile {self.dir / f'sshd_{h.name}.pid'}\n"
                "Subsystem sftp internal-sftp\n"
                "LogLevel ERROR\n"
            )
            mounts = "mount -t tmpfs nbckpt-host /srv"
            if storage is not None:
                mounts += f" && mkdir {HOST_STORAGE} && mount --bind {shlex.quote(str(storage))} "
                mounts += HOST_STORAGE
            script = f'hostname "$0" && {mounts} && exec {SSHD} -D -e -f {shlex.quote(str(conf))}'
            log = (self.dir / f"sshd_{h.name}.log").open("wb")
            argv = ["ip", "netns", "exec", h.netns, "unshare", "--uts", "--mount"]
            argv += ["--propagation", "private", "sh", "-c", script, h.name]
            self._procs.append(subprocess.Popen(argv, stdout=log, stderr=log))
        for h in self.hosts.hosts:
            self._wait_for(h.name)

    def _wait_for(self, name: str, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            done = subprocess.run(self.ssh(name, "hostname"), capture_output=True, text=True)
            if done.returncode == 0 and done.stdout.strip() == name:
                return
            if time.monotonic() > deadline:
                log = (self.dir / f"sshd_{name}.log").read_text(errors="replace")
                raise RuntimeError(f"sshd on {name} did not answer: {done.stderr.strip()} {log}")
            time.sleep(0.2)

    def ssh(self, name: str, command: str) -> list[str]:
        """The argv that runs ``command`` on host ``name`` over ssh."""
        return ["ssh", "-F", str(self.config), name, command]

    def close(self) -> None:
        """Stop every sshd and every process left on the hosts (engines included)."""
        for h in self.hosts.hosts:
            self.hosts.kill(h.index)
        for proc in self._procs:
            proc.wait(timeout=10)
        self._procs.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
