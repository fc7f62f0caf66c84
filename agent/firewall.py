"""Jobs cannot reach the node's own services: nftables rules on the job uids' loopback traffic.

Whatever listens on the node — the agent's metrics port, and on a small install PostgreSQL and
Redis — is reached through the loopback interface, from ``127.0.0.1`` or the node's own addresses
alike. A job's uid (agent/identity.py) may use it only

- to talk to its own processes (a job's rendezvous server, a local inference server it starts, the
  replicas of one attempt on this node, which share its uid);
- for DNS (port 53: a local resolver such as systemd-resolved);
- to the ports the operator allows (``--allow-local-port``).

How, for TCP, where the kernel does not say who listens when a connection opens: a job's new
connection to a local address is let through and marked (its conntrack entry, with the job's uid
in a set); its first answer, the SYN-ACK, is sent by the listening socket, whose owner the
``output`` hook sees: not the same uid, the answer is dropped, so the connection never opens (the
job's ``connect`` times out) and the listener's application never sees it. Other protocols (UDP,
which has no answer to wait for) to a local address are rejected outright, DNS apart.

Traffic that leaves the node (the internet, the replicas of a job on other nodes) is not touched,
and neither are connections from the node to a job. The rules live in their own table,
``inet tessera_jobs_<first>_<last>``, replaced whole (atomically) by each agent that starts with
that range: agents sharing a machine share it; it stays when the agent stops (it concerns only
the job uids); ``nft delete table inet tessera_jobs_<first>_<last>`` removes it.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Iterable

from agent.identity import UidRange
from agent.sandbox import SYSTEM_PATH

log = logging.getLogger("tessera.agent")

PENDING_MARK = 0x7E550001  # a job's connection to a local address, not yet answered
SEEN_MARK = 0x7E550002  # answered by a socket of the job's own uid


def table_name(ids: UidRange) -> str:
    return f"tessera_jobs_{ids.first}_{ids.last}"


def ruleset(ids: UidRange, allowed_ports: Iterable[int] = ()) -> str:
    """The nft script that (re)places the table."""
    name = table_name(ids)
    ports = sorted(set(allowed_ports))
    allowed = f"\n    tcp dport {{ {', '.join(map(str, ports))} }} accept" if ports else ""
    return f"""add table inet {name}
delete table inet {name}
table inet {name} {{
  set pending {{
    typeof ct id . meta skuid
    flags timeout
    timeout 5m
    size 262144
  }}
  chain output {{
    type filter hook output priority filter; policy accept;
    oifname "lo" meta skuid {ids.first}-{ids.last} ct state new jump from_job
    oifname "lo" ct direction reply ct mark {PENDING_MARK:#x} jump answer_to_job
  }}
  chain from_job {{
    meta l4proto {{ tcp, udp }} th dport 53 accept{allowed}
    meta l4proto tcp ct mark set {PENDING_MARK:#x} add @pending {{ ct id . meta skuid }} accept
    reject
  }}
  chain answer_to_job {{
    ct id . meta skuid @pending ct mark set {SEEN_MARK:#x} accept
    drop
  }}
}}
"""


def install(ids: UidRange, allowed_ports: Iterable[int] = ()) -> str | None:
    """Load the rules; None when they are in place, otherwise why not (logged by the caller)."""
    nft = shutil.which("nft", path=SYSTEM_PATH)
    if nft is None:
        return "no nft (the nftables package) on this machine"
    try:
        done = subprocess.run(
            [nft, "-f", "-"], input=ruleset(ids, allowed_ports), capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot run nft: {exc}"
    if done.returncode != 0:
        return f"nft refused the rules: {done.stderr.strip() or done.returncode}"
    return None


def detect(ids: UidRange, allowed_ports: Iterable[int] = ()) -> bool:
    """Install the rules, saying at the start what jobs can reach; whether they are in place."""
    ports = sorted(set(allowed_ports))
    reason = install(ids, ports)
    if reason is None:
        log.info(
            "jobs reach the node's loopback only for their own processes, DNS%s (nftables table %s)",
            f" and ports {', '.join(map(str, ports))}" if ports else "",
            table_name(ids),
        )
        return True
    log.warning("jobs CAN reach every service listening on this node (the agent's ports too): %s", reason)
    return False
