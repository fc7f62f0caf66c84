"""Machines of their own on one network, on this machine: Linux network namespaces, for tests.

:meth:`Network.create` makes a namespace per node, each with its own address on one /24, joined
by a bridge, and gives the root namespace (where the test's servers run) the network's first
address, so the nodes reach a server listening there. :meth:`Network.argv` runs a command in a
node's namespace with ``nsenter``: only the network is the node's own; files, users, processes and
cgroups are this machine's. The bridge lives in a namespace of its own too: traffic between the
nodes then crosses no firewall of this machine (a bridge in the root namespace would send it
through the root's iptables ``FORWARD`` chain where ``br_netfilter`` is loaded, which Docker sets
to drop).

Names carry this process's id and a random tag, and the subnet is one no route of this machine
overlaps (chosen under a lock), so test runs side by side do not collide. :meth:`Network.close`
kills what still runs in the nodes' namespaces and deletes the namespaces, their links with them.
Making one needs root, ``ip`` (iproute2) and ``nsenter`` (util-linux); :class:`Unavailable` says
which is missing.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

LOCK = "/run/lock/tessera-test-netns.lock"


class Unavailable(Exception):
    """Network namespaces cannot be made here; the message says why."""


def _ip(*args: str) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise Unavailable(f"ip {' '.join(args)}: {done.stderr.strip() or f'exit {done.returncode}'}")
    return done.stdout


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _free_subnet() -> ipaddress.IPv4Network:
    """A 10.x.y.0/24 that no route of this machine (any table: its own addresses too) overlaps."""
    routes = json.loads(_ip("-j", "-4", "route", "show", "table", "all") or "[]")
    taken = [
        ipaddress.ip_network(r["dst"], strict=False)
        for r in routes
        if r.get("dst") not in (None, "default") and ":" not in r["dst"]
    ]
    for _ in range(100):
        subnet = ipaddress.IPv4Network(f"10.{random.randint(64, 254)}.{random.randint(0, 255)}.0/24")
        if not any(subnet.overlaps(t) for t in taken if t.prefixlen > 0):
            return subnet
    raise Unavailable("no free 10.x.y.0/24 among 100 tried")


@dataclass
class Network:
    tag: str
    subnet: ipaddress.IPv4Network | None = None
    server_address: str = ""
    addresses: dict[str, str] = field(default_factory=dict)  # node -> its address
    namespaces: list[str] = field(default_factory=list)  # every namespace made, the bridge's first

    @classmethod
    def create(cls, nodes: Sequence[str]) -> Network:
        """A namespace per node (see the module's docstring); :class:`Unavailable` if none can be made."""
        if os.geteuid() != 0:
            raise Unavailable("making network namespaces needs root")
        for tool in ("ip", "nsenter"):
            if shutil.which(tool) is None:
                raise Unavailable(f"no {tool} on this machine")
        net = cls(tag=f"{os.getpid()}-{secrets.token_hex(3)}")
        try:
            net._build(nodes)
        except BaseException:
            net.close()
            raise
        return net

    def _namespace(self, role: str) -> str:
        name = f"tessera-test-{self.tag}-{role}"
        _ip("netns", "add", name)
        self.namespaces.append(name)
        _ip("-n", name, "link", "set", "lo", "up")
        return name

    @property
    def _root_link(self) -> str:  # at most 15 characters, unique on this machine
        return "tt" + self.tag.split("-")[1]

    def _build(self, nodes: Sequence[str]) -> None:
        switch = self._namespace("switch")
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        with _locked():  # the subnet is taken once the root's address is set
            self.subnet = _free_subnet()
            hosts = self.subnet.hosts()
            self.server_address = str(next(hosts))
            _ip("link", "add", self._root_link, "type", "veth", "peer", "name", "root", "netns", switch)
            _ip("addr", "add", f"{self.server_address}/24", "dev", self._root_link)
            _ip("link", "set", self._root_link, "up")
        _ip("-n", switch, "link", "set", "root", "master", "br0", "up")
        for i, node in enumerate(nodes):
            ns = self._namespace(f"n{i}")
            self.addresses[node] = str(next(hosts))
            _ip("-n", switch, "link", "add", f"n{i}", "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("-n", switch, "link", "set", f"n{i}", "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{self.addresses[node]}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")

    def argv(self, node: str, command: Sequence[str]) -> list[str]:
        """``command`` run in ``node``'s namespace (``nsenter`` execs it: the same process)."""
        ns = self.namespaces[1 + list(self.addresses).index(node)]
        return ["nsenter", f"--net=/run/netns/{ns}", "--", *command]

    def close(self) -> None:
        """Kill what still runs in the nodes' namespaces, delete every namespace (their links go
        with them) and the root's end of the bridge's link. Errors are ignored: it runs on
        failures too, after a part of :meth:`_build`."""
        for ns in self.namespaces:
            with contextlib.suppress(Unavailable, subprocess.SubprocessError):
                for pid in _ip("netns", "pids", ns).split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(self.pids()):
            time.sleep(0.05)
        for ns in reversed(self.namespaces):
            with contextlib.suppress(Unavailable, subprocess.SubprocessError):
                _ip("netns", "delete", ns)
        with contextlib.suppress(Unavailable, subprocess.SubprocessError):
            _ip("link", "delete", self._root_link)
        self.namespaces = []

    def pids(self) -> list[int]:
        """The processes still running in the nodes' namespaces."""
        out: list[int] = []
        for ns in self.namespaces:
            with contextlib.suppress(Unavailable, subprocess.SubprocessError):
                out += [int(pid) for pid in _ip("netns", "pids", ns).split()]
        return out
