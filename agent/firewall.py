"""Jobs cannot reach the node's own services: nftables rules on the job uids' loopback traffic.

Whatever listens on the node — the agent's metrics port, and on a small install PostgreSQL and
Redis — is reached through the loopback interface, from ``127.0.0.1`` or the node's own addresses
alike. A job's uid (agent/identity.py) may use it only

- to talk to its own processes (a job's rendezvous server, a local inference server it starts, the
  replicas of one attempt on this node, which share its uid);
- for DNS (port 53: a local resolver such as systemd-resolved);
- to the ports the operator allows (``--allow-local-port``).

How, for TCP, where the kernel does not say who listens when a connection opens: a job's new
connection to a local address is let through and marked with the job's uid (its conntrack
entry's mark); its first answer, the SYN-ACK, is sent by the listening socket, whose owner the
``output`` hook sees: not the uid of the mark, the answer is dropped, so the connection never opens
(the job's ``connect`` times out) and the listener's application never sees it; a reset sent to
the listener in its place removes the half-open connection there at once. Other protocols (UDP,
which has no answer to wait for) to a local address are rejected outright, DNS apart. So is a
connection to a local address that destination NAT sends elsewhere (a port Docker publishes on the
node's addresses for a container, a Kubernetes hostPort): it still leaves on "lo" in the output
hook, but its answer comes from another interface and never passes there to be judged. The rules
keep nothing per connection but the mark (an earlier version kept each pending connection in a
set of 262,144: a job opening connections faster than about 900 a second could fill it, and then
every job of the node was refused its own local connections, a ``torchrun`` rendezvous's among
them).

The kernel's record of that connection outlives it (for a minute, while the listener retried its
answer), and it is keyed by the addresses and ports alone: the next connection from the same port
to the same service — the kernel hands ports out again, and a job may bind one on purpose, or all
of them — would find it, still marked as the job's, and have its answers dropped too. So a packet
sent on such a record by a uid other than the mark's clears the mark: the node's own client
connects as if nothing had been there, and another job's uid is judged afresh, as a new connection.

Traffic that leaves the node (the internet, the replicas of a job on other nodes) is not touched,
and neither are connections from the node to a job.

Several agents share a machine and a uid range (the demo runs 12; test runs run side by side), each
with its own ``--allow-local-port``. The rules of the range live in one table,
``inet tessera_jobs_<first>_<last>``, whose common part (the same for every agent) each agent
rewrites atomically at its start and none ever deletes; each agent's allowed ports are a chain of
its own in it, ``agent_<pid>_<start>_<n>``, and a map sends each job uid to the chain of the agent
holding it: set when the agent claims the uid (agent/identity.py, under the uid's lock, before the
job is spawned), removed when it gives it back. So one agent never changes what another's jobs may
reach; a uid no agent holds gets the common part alone (its own processes and DNS). An agent removes
its chain when it stops; the chain of a dead agent is removed by the next agent that starts, once
no uid points to it any more. ``nft delete table inet tessera_jobs_<first>_<last>`` removes all.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

from agent.identity import MAX_RANGE, UidRange
from agent.sandbox import SYSTEM_PATH

log = logging.getLogger("tessera.agent")

SEEN_MARK = 0x7E550002  # a job's connection to a local address, answered by a socket of its uid
LOADED = "uids_loaded"  # the empty chain that says the uid elements are in the table


class Unavailable(Exception):
    """The rules cannot be installed; the message says why."""


_counter = itertools.count()


def table_name(ids: UidRange) -> str:
    return f"tessera_jobs_{ids.first}_{ids.last}"


def _start_time(pid: int) -> str | None:
    """The start time of ``pid`` (clock ticks since boot): with the pid, names one process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def common_rules(ids: UidRange) -> str:
    """The nft script of the range's common part: the same for every agent, so rewriting it is
    harmless; the per-agent chains and the maps' elements are left as they are.

    A job's new connection to a local address carries its uid as the connection's mark (through
    ``mark_of``: nft copies no uid into a mark directly); the answer is let through only when its
    sender's uid and the mark are a pair of ``same``. Both hold one element per uid of the range,
    loaded once (:func:`uid_elements`): no state per connection that a job's attempts could fill."""
    t = f"inet {table_name(ids)}"
    pending = f"ct mark {ids.first}-{ids.last}"  # a job's connection, not yet answered
    size = len(ids)
    return f"""add table {t}
add set {t} same {{ typeof meta skuid . ct mark; size {size}; }}
add map {t} mark_of {{ typeof meta skuid : ct mark; size {size}; }}
add map {t} agents {{ typeof meta skuid : verdict; }}
add chain {t} output {{ type filter hook output priority filter; policy accept; }}
add chain {t} from_job
add chain {t} answer_to_job
add chain {t} reused
flush chain {t} output
flush chain {t} from_job
flush chain {t} answer_to_job
flush chain {t} reused
add rule {t} output oifname "lo" meta skuid {ids.first}-{ids.last} ct state new jump from_job
add rule {t} output oifname "lo" ct direction original {pending} meta skuid . ct mark != @same jump reused
add rule {t} output oifname "lo" ct direction reply {pending} jump answer_to_job
add rule {t} from_job meta l4proto {{ tcp, udp }} th dport 53 accept
add rule {t} from_job meta skuid vmap @agents
add rule {t} from_job fib daddr type != local reject
add rule {t} from_job meta l4proto tcp ct mark set meta skuid map @mark_of accept
add rule {t} from_job reject
add rule {t} reused ct mark set 0
add rule {t} reused meta skuid {ids.first}-{ids.last} jump from_job
add rule {t} answer_to_job meta skuid . ct mark @same ct mark set {SEEN_MARK:#x} accept
add rule {t} answer_to_job meta l4proto tcp reject with tcp reset
add rule {t} answer_to_job drop
"""


def uid_elements(ids: UidRange) -> str:
    """The nft script that fills ``same`` and ``mark_of``, with the empty chain that says it ran
    (one transaction: the chain exists only with every element): 65,536 uids load in about 2 s."""
    t = f"inet {table_name(ids)}"
    uids = range(ids.first, ids.last + 1)
    return (
        f"add element {t} same {{ {', '.join(f'{u} . {u}' for u in uids)} }}\n"
        f"add element {t} mark_of {{ {', '.join(f'{u} : {u}' for u in uids)} }}\n"
        f"add chain {t} {LOADED}\n"
    )


class LoopbackRules:
    """One agent's part of the range's table: its chain of allowed ports, and its uids in the map."""

    def __init__(self, ids: UidRange, allowed_ports: Iterable[int], nft: str):
        self.ids, self.nft = ids, nft
        self.ports = sorted(set(allowed_ports))
        self.table = f"inet {table_name(ids)}"
        self.chain = f"agent_{os.getpid()}_{_start_time(os.getpid())}_{next(_counter)}"

    def _run(self, script: str) -> str | None:
        """Run an nft script (one transaction); None when it was applied, otherwise nft's error."""
        try:
            done = subprocess.run(
                [self.nft, "-f", "-"], input=script, capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.SubprocessError) as exc:
            return f"cannot run nft: {exc}"
        return None if done.returncode == 0 else (done.stderr.strip() or f"nft exited {done.returncode}")

    def install(self) -> None:
        own = f"add chain {self.table} {self.chain}\n"
        if self.ports:
            ports = ", ".join(map(str, self.ports))
            own += f"add rule {self.table} {self.chain} tcp dport {{ {ports} }} accept\n"
        if len(self.ids) > MAX_RANGE or SEEN_MARK in self.ids:
            raise Unavailable(
                f"job uids {self.ids}: the loopback rules take a range of at most {MAX_RANGE} uids, "
                f"without {SEEN_MARK}"
            )
        error = self._run(common_rules(self.ids) + own)
        chains = self._chains() if error is None else []
        if error is None and LOADED not in chains:  # the uid elements, once per range
            error = self._run(uid_elements(self.ids))
            if error is not None and LOADED in self._chains():  # another agent's start loaded them
                error = None
        if error is not None:
            raise Unavailable(f"nft refused the rules: {error}")
        self._sweep(chains)

    def _chains(self) -> list[str]:
        """The names of the chains of the range's table (listing chains, not rules, reads no set:
        a few milliseconds, where listing one chain's rules takes the sets' 131,072 elements)."""
        try:
            listed = subprocess.run(
                [self.nft, "-j", "list", "chains", "inet"], capture_output=True, text=True, timeout=30
            )
            entries = json.loads(listed.stdout)["nftables"]
        except (OSError, subprocess.SubprocessError, ValueError, KeyError, TypeError):
            return []
        table = table_name(self.ids)
        chains = [e.get("chain", {}) for e in entries if isinstance(e, dict)]
        return [str(c.get("name", "")) for c in chains if c.get("table") == table]

    def _sweep(self, chains: list[str]) -> None:
        """Remove, of the table's ``chains``, those of dead agents that no uid points to any more
        (a uid pointing to one is pointed elsewhere by the next agent that claims it)."""
        for name in chains:
            parts = name.split("_")
            if len(parts) != 4 or parts[0] != "agent" or not parts[1].isdigit():
                continue
            if _start_time(int(parts[1])) != parts[2]:  # its agent is dead
                self._run(f"delete chain {self.table} {name}\n")  # refused while a uid points to it

    def claimed(self, uid: int, stale: bool = True) -> None:
        """Point ``uid`` at this agent's chain (before its job is spawned). ``stale``: the uid's
        last holder died holding it, so it may still point at that holder's chain.

        An agent that allows no port has an empty chain: a uid pointing nowhere gets the same
        (the common part), so it adds nothing and only takes a dead holder's element away. That
        spares two ``nft`` runs a job (3-4 ms of CPU each, docs/benchmarks/e2e.md)."""
        if not self.ports:
            if stale:
                self._run(f"delete element {self.table} agents {{ {uid} }}\n")  # none: nothing to do
            return
        element = f"{{ {uid} : jump {self.chain} }}"
        if self._run(f"add element {self.table} agents {element}\n") is None:
            return
        error = self._run(
            f"delete element {self.table} agents {{ {uid} }}\nadd element {self.table} agents {element}\n"
        )
        if error is not None:
            log.warning(
                "uid %d: its jobs get only the common loopback rules, not --allow-local-port: %s", uid, error
            )

    def released(self, uid: int) -> bool:
        """``uid`` is given back (no process of it left): it points nowhere any more. False when
        its element could not be removed (the uid is then treated as stale at its next claim)."""
        if not self.ports:
            return True
        error = self._run(f"delete element {self.table} agents {{ {uid} }}\n")
        if error is not None:
            log.warning("uid %d: its loopback rule could not be removed: %s", uid, error)
        return error is None

    def close(self) -> None:
        """At the agent's end: its chain goes (refused, and swept later, while a uid points to it)."""
        self._run(f"delete chain {self.table} {self.chain}\n")


def install(ids: UidRange, allowed_ports: Iterable[int] = ()) -> LoopbackRules:
    """Load the common rules and this agent's chain; raises :class:`Unavailable` saying why not."""
    nft = shutil.which("nft", path=SYSTEM_PATH)
    if nft is None:
        raise Unavailable("no nft (the nftables package) on this machine")
    rules = LoopbackRules(ids, allowed_ports, nft)
    rules.install()
    return rules


def detect(ids: UidRange, allowed_ports: Iterable[int] = ()) -> LoopbackRules | None:
    """Install the rules, saying at the start what jobs can reach; None when they are not in place."""
    ports = sorted(set(allowed_ports))
    try:
        rules = install(ids, ports)
    except Unavailable as exc:
        log.warning("jobs CAN reach every service listening on this node (the agent's ports too): %s", exc)
        return None
    log.info(
        "jobs reach the node's loopback only for their own processes, DNS%s (nftables table %s, chain %s)",
        f" and ports {', '.join(map(str, ports))}" if ports else "",
        table_name(ids),
        rules.chain,
    )
    return rules
