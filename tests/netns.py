"""Several hosts on one machine, for real: a Ray cluster across Linux network namespaces.

Each host is a network namespace of its own with one address (10.77.0.1, .2, ...) on a veth pair whose
other end sits on a bridge in the root namespace; a Ray node runs inside each (its own temp dir), the head
in host 0. A driver started with `run_in(0, ...)` joins the cluster from host 0, so every byte between
workers crosses the veth links: nothing listens on the root namespace's addresses, and no route leads
out of the hosts' subnet (`ways_out`). Faults: `partition` takes a host's link down, `kill_host` kills
every process in a host. The names are fixed (one harness per machine at a time): a harness removes what
an earlier, killed one left behind.

Making namespaces needs root and the `ip` tool; `available()` says why not where they are missing (tests
skip with that reason). Everything made is removed on exit, also after a failure.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SUBNET = "10.77.0"
BRIDGE = "m2flow-br0"
PORT = 6379
# the cluster lives on private addresses inside namespaces made for it: no token between its nodes
ENV = {**os.environ, "RAY_AUTH_MODE": "disabled"}


def available() -> str | None:
    """None if namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "the `ip` tool (iproute2) is not installed"
    probe = "m2flow-probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot make a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _no_ipv6(link: str) -> None:
    """Turn IPv6 off on a root-namespace link (no link-local address), where the kernel has IPv6."""
    switch = Path(f"/proc/sys/net/ipv6/conf/{link}/disable_ipv6")
    if switch.exists():
        switch.write_text("1")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


class Hosts:
    """`count` hosts, each a namespace with a Ray node of `cpus` CPUs; use as a context manager."""

    def __init__(self, count: int, cpus: int, ray_bin: str | None = None):
        self.count, self.cpus = count, cpus
        self.temp = Path(tempfile.mkdtemp(prefix="m2h", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
        self.ray = ray_bin or str(Path(sys.executable).with_name("ray"))
        self.names = [f"m2flow-h{i}" for i in range(count)]

    def address(self, host: int) -> str:
        return f"{SUBNET}.{host + 1}"

    @property
    def ray_address(self) -> str:
        return f"{self.address(0)}:{PORT}"

    def __enter__(self) -> Hosts:
        try:
            self._network()
            self._ray()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        for host in range(self.count):
            self.kill_host(host)
        self._remove_network()
        shutil.rmtree(self.temp, ignore_errors=True)

    def _remove_network(self) -> None:
        for i, name in enumerate(self.names):
            subprocess.run(["ip", "link", "del", f"m2flow-v{i}"], capture_output=True)
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)

    def _network(self) -> None:
        self._remove_network()  # what a killed earlier run left behind
        _ip("link", "add", BRIDGE, "type", "bridge")
        _no_ipv6(BRIDGE)  # no link-local address: the root namespace answers on nothing the hosts can reach
        _ip("link", "set", BRIDGE, "up")
        for i, name in enumerate(self.names):
            _ip("netns", "add", name)
            _ip("link", "add", f"m2flow-v{i}", "type", "veth", "peer", "name", "eth0", "netns", name)
            _no_ipv6(f"m2flow-v{i}")
            _ip("link", "set", f"m2flow-v{i}", "master", BRIDGE)
            _ip("link", "set", f"m2flow-v{i}", "up")
            ipv6_off = "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6"  # the namespace's own, if it has IPv6
            subprocess.run(["ip", "netns", "exec", name, "sh", "-c", ipv6_off], capture_output=True)
            _ip("-n", name, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
            _ip("-n", name, "link", "set", "eth0", "up")
            _ip("-n", name, "link", "set", "lo", "up")

    def _ray(self) -> None:
        for i in range(self.count):
            head = ["--head", f"--port={PORT}", "--include-dashboard=false"]
            role = head if i == 0 else [f"--address={self.ray_address}"]
            temp = self.temp / str(i)
            args = [
                self.ray,
                "start",
                *role,
                f"--node-ip-address={self.address(i)}",
                f"--num-cpus={self.cpus}",
                "--num-gpus=0",
                f"--temp-dir={temp}",
                "--object-store-memory=100000000",
                "--disable-usage-stats",
            ]
            started = self.run_in(i, args, timeout=120)
            if started.returncode != 0:
                raise RuntimeError(f"ray start on host {i} failed:\n{started.stdout}\n{started.stderr}")

    def run_in(self, host: int, args: list[str], timeout: float) -> subprocess.CompletedProcess:
        """Run `args` in `host`'s namespace to the end."""
        command = ["ip", "netns", "exec", self.names[host], *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=ENV)

    def start_in(self, host: int, args: list[str], env: dict[str, str] | None = None, **kwargs) -> subprocess.Popen:
        """Start `args` in `host`'s namespace (`env` added to the environment)."""
        return subprocess.Popen(["ip", "netns", "exec", self.names[host], *args], env={**ENV, **(env or {})}, **kwargs)

    def pids(self, host: int) -> list[int]:
        listed = subprocess.run(["ip", "netns", "pids", self.names[host]], capture_output=True, text=True)
        return [int(p) for p in listed.stdout.split()]

    def link_bytes(self, host: int) -> int:
        """Bytes `host`'s link has carried both ways (its root-namespace end's counters)."""
        stats = Path(f"/sys/class/net/m2flow-v{host}/statistics")
        return sum(int((stats / f"{way}_bytes").read_text()) for way in ("rx", "tx"))

    def ways_out(self) -> list[str]:
        """Every way traffic could leave the hosts' namespaces (none: it stays between them): an address on
        the bridge or a link's root-namespace end (the root namespace would answer on it), or a route in a
        host to anywhere but the hosts' subnet."""
        ways = []
        for link in [BRIDGE, *(f"m2flow-v{i}" for i in range(self.count))]:
            held = subprocess.run(["ip", "-o", "addr", "show", "dev", link], capture_output=True, text=True).stdout
            ways += [f"{link} has an address: {line}" for line in held.splitlines()]
        for name in self.names:
            for family in ("-4", "-6"):
                routes = subprocess.run(["ip", "-n", name, family, "route"], capture_output=True, text=True).stdout
                ways += [f"{name} routes {r}" for r in routes.splitlines() if not r.startswith(f"{SUBNET}.0/24 ")]
        return ways

    def partition(self, host: int) -> None:
        """Take `host`'s link down: it and the others stop hearing each other."""
        _ip("link", "set", f"m2flow-v{host}", "down")

    def kill_host(self, host: int) -> None:
        """SIGKILL every process in `host`'s namespace (its Ray node and the workers on it)."""
        for _ in range(3):  # processes may fork while they are killed
            pids = self.pids(host)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if not pids:
                return
            time.sleep(0.2)
