"""``python -m agent``: register this node, then run its jobs until Ctrl-C.

    python -m agent --server URL --join-token-file PATH [--simulate "8xA100,nvlink=4,rack=r2"]
    TESSERA_JOIN_TOKEN=... python -m agent --server URL [--simulate SPEC]
    python -m agent --server URL --join-token - < token-file

Exit codes: 0 after Ctrl-C/SIGTERM; 1 the server could not be reached in time; 2 bad arguments,
a refused join token or no GPU found; 3 the node's credential was revoked while running; 4 processes
left by a previous run would not die (agent/leftovers.py), so the node was not registered.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import socket
import sys
import threading
import time
import urllib.parse
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit

from agent import cgroups, firewall, identity, leftovers, sandbox, state
from agent.client import AgentClient, Rejected, ServerError
from agent.inventory import Inventory, ModelMap, NoGPUs, nvml_inventory, simulated_inventory
from agent.metrics import GpuCollector, UtilProfiles, make_registry, nvml_reader, serve
from agent.node import Agent, CredentialRevoked
from agent.process import job_path, protect_from_oom, runs_as
from agent.spec import SpecError, parse_labels, parse_spec

log = logging.getLogger("tessera.agent")
TOKEN_ENV = "TESSERA_JOIN_TOKEN"


class Fatal(Exception):
    """Stop with a message and an exit code."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m agent", description="Tessera node agent")
    p.add_argument(
        "--server",
        default=os.environ.get("TESSERA_SERVER"),
        help="control plane URL, e.g. http://127.0.0.1:8000 (or $TESSERA_SERVER)",
    )
    p.add_argument(
        "--join-token",
        metavar="T",
        help="join token; '-' reads it from stdin. Prefer $TESSERA_JOIN_TOKEN or "
        "--join-token-file: a literal token is visible in ps until the agent re-executes",
    )
    p.add_argument("--join-token-file", metavar="PATH", help="file holding the join token")
    p.add_argument("--join-token-fd", type=int, help=argparse.SUPPRESS)  # internal: after re-exec
    p.add_argument(
        "--simulate",
        metavar="SPEC",
        help="simulated GPUs: COUNTxMODEL[,nvlink=N][,rack=R][,cpus=N][,memory_gib=N]"
        '[,labels=k:v;k:v], e.g. "8xA100,nvlink=4,rack=r2"',
    )
    p.add_argument("--name", default=socket.gethostname(), help="node name (default: hostname)")
    p.add_argument("--rack", default="default", help="rack (NVML mode; a SPEC sets its own)")
    p.add_argument("--labels", default="", help="k:v;k:v (NVML mode; a SPEC sets its own)")
    p.add_argument("--nvlink", type=int, help="GPUs per NVLink island (NVML mode; default: detected)")
    p.add_argument("--model-map", metavar="FILE", help="JSON {NVML name: short model} extending the table")
    p.add_argument(
        "--price-per-gpu-hour",
        type=float,
        metavar="P",
        help="what a GPU-hour here costs (the scheduler's α weighs it); sent at every registration "
        "(default: not sent, the operator sets it in the admin)",
    )
    p.add_argument("--metrics-port", type=int, default=9400, help="/metrics port (0 = any free port)")
    p.add_argument("--metrics-addr", default="0.0.0.0", help="address /metrics listens on")
    p.add_argument(
        "--advertise-host",
        help="host in the metrics URL given to the server "
        "(default: --metrics-addr, or the hostname when that is 0.0.0.0)",
    )
    p.add_argument(
        "--address",
        help="the host name or IP address other nodes reach this one at: a distributed job's "
        "MASTER_ADDR when its first replica runs here (default: --advertise-host, else this "
        "machine's address on its route to the server)",
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        help="credential and job directories "
        "(default: $TESSERA_AGENT_STATE_DIR, /var/lib/tessera-agent/NAME as root)",
    )
    p.add_argument(
        "--job-uids",
        metavar="FIRST-LAST",
        default=os.environ.get("TESSERA_JOB_UIDS", identity.DEFAULT_RANGE),
        help="uids (and gids of the same numbers) given to jobs, one per job attempt; no user or "
        f"group of this machine may have one (or $TESSERA_JOB_UIDS; default {identity.DEFAULT_RANGE})",
    )
    p.add_argument(
        "--single-tenant",
        action="store_true",
        help="run every job as one user (--run-as; the agent's own when not root): UNSAFE for a node "
        "shared by tenants, as any job can then read, signal and overwrite any other",
    )
    p.add_argument("--run-as", default="nobody", help="with --single-tenant as root: the user jobs run as")
    p.add_argument(
        "--allow-local-port",
        type=int,
        action="append",
        default=[],
        metavar="PORT",
        help="a TCP port on this node jobs may connect to (repeatable; by default they reach only "
        "their own processes and DNS on the node's own addresses)",
    )
    p.add_argument(
        "--hide-path",
        action="append",
        default=[],
        metavar="PATH",
        help="a directory or file (a service's unix socket) jobs must not see, in addition to "
        "PostgreSQL's, MySQL's, Redis's, Docker's, containerd's, D-Bus's, syslog's and journald's "
        "(repeatable)",
    )
    p.add_argument(
        "--job-max-tasks",
        type=int,
        metavar="N",
        help="processes and threads a job attempt's uid may have at once when it holds the whole "
        "node (a replica gets its share of the node's GPUs, or CPUs, of it: at least 256), so a "
        "fork bomb harms only its own job (default: a quarter of kernel.pid_max, 1024..65536)",
    )
    p.add_argument(
        "--job-log-buffer-mb",
        type=int,
        default=32,
        metavar="MB",
        help="output of a job replica not yet sent that the agent holds (the server unreachable, "
        "or slower than the job writes); past it output is dropped, and a line in the job's log "
        "says how much (default: %(default)s)",
    )
    p.add_argument(
        "--job-disk-mb",
        type=int,
        metavar="MB",
        help="disk a job attempt may fill: each of its private /tmp, /var/tmp and /dev/shm holds "
        "at most this much, no file it writes grows past it, and a job whose own directories "
        "(working and checkpoint) and private /tmp, /var/tmp and /dev/shm hold more together is "
        "stopped, failing with reason disk-limit "
        "(default: 100 GiB or its share of half the state directory's free space, by its share of "
        "the node's GPUs or CPUs, whichever is less; at least 1 GiB)",
    )
    p.add_argument(
        "--job-max-files",
        type=int,
        metavar="N",
        help="files (inodes: directories and links too) a job attempt may make: each of its "
        "private /tmp, /var/tmp and /dev/shm holds at most this many, and a job whose own "
        "directories and private /tmp, /var/tmp and /dev/shm hold more together is stopped, "
        "failing with reason disk-limit (default: a million, or its share of half the state "
        "directory's free inodes, whichever is less; at least 10,000)",
    )
    p.add_argument(
        "--require-isolation",
        action="store_true",
        help="refuse to start unless jobs get their own uids, private mounts, the loopback rules and "
        "a Landlock domain each (abstract unix sockets and signals scoped)",
    )
    p.add_argument(
        "--checkpoint-root",
        default=os.environ.get("TESSERA_CHECKPOINT_ROOT", ""),
        metavar="DIR",
        help="a directory every node mounts (NFS, ...) for the jobs' checkpoint directories, so a "
        "job requeued onto another node resumes from its checkpoint ($TESSERA_CHECKPOINT_ROOT; "
        "default: node-local, STATE/checkpoints)",
    )
    p.add_argument(
        "--checkpoint-root-name",
        default=os.environ.get("TESSERA_CHECKPOINT_ROOT_NAME", ""),
        metavar="NAME",
        help="what the server knows the shared checkpoint root by: nodes that register the same "
        "one can resume each other's jobs' checkpoints; set it where the same share is mounted "
        "at different paths, or different shares at one path ($TESSERA_CHECKPOINT_ROOT_NAME; "
        "default: the root's path)",
    )
    p.add_argument(
        "--checkpoint-signal",
        default="SIGUSR1",
        metavar="SIGNAL",
        help="sent to a job that writes its checkpoint marker before it is preempted: "
        "'checkpoint now' (default SIGUSR1)",
    )
    p.add_argument(
        "--checkpoint-retention-hours",
        type=float,
        default=168.0,
        help="remove a job's checkpoint directory this long after its job ended (the server says "
        "when), never while it can still resume (default: 168, a week)",
    )
    p.add_argument(
        "--poll-interval",
        type=float,
        default=5.0,
        help="seconds between heartbeats (work arrives at once through the stream or long-poll)",
    )
    p.add_argument(
        "--no-stream",
        action="store_true",
        help="take pushed work through the HTTP long-poll, not the websocket stream",
    )
    p.add_argument(
        "--wait-timeout",
        type=float,
        default=25.0,
        help="seconds the long-poll for pushed work stays open (0: no push at all, poll only)",
    )
    p.add_argument(
        "--util-speed",
        type=float,
        default=1.0,
        help="simulated utilisation: trace samples (minutes) per minute of job time",
    )
    p.add_argument(
        "--shutdown-grace",
        type=float,
        default=10.0,
        help="on Ctrl-C, seconds jobs get between SIGTERM and SIGKILL",
    )
    p.add_argument(
        "--register-timeout",
        type=float,
        default=120.0,
        help="seconds to keep trying to reach the server at start",
    )
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p


def reexec_without_literal_token(argv: list[str]) -> None:
    """A literal ``--join-token T`` is in our argv, which ``ps`` shows to every user: pass it
    through a pipe instead and re-execute. (It was visible for the moment before this.)"""
    token, rest, i = None, [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--join-token" and i + 1 < len(argv) and argv[i + 1] != "-":
            token, i = argv[i + 1], i + 2
            continue
        if arg.startswith("--join-token=") and arg != "--join-token=-":
            token, i = arg.split("=", 1)[1], i + 1
            continue
        rest.append(arg)
        i += 1
    if token is None:
        return
    print(
        "tessera-agent: warning: --join-token on the command line is visible in ps; use "
        f"${TOKEN_ENV} or --join-token-file (re-executing without it)",
        file=sys.stderr,
    )
    read_end, write_end = os.pipe()
    os.write(write_end, token.encode())
    os.close(write_end)
    os.set_inheritable(read_end, True)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "agent", *rest, "--join-token-fd", str(read_end)])


def join_token(args: argparse.Namespace) -> str | None:
    from_env = os.environ.pop(TOKEN_ENV, "").strip()  # passed on to nothing we start
    if args.join_token_fd is not None:
        return state.read_secret_fd(args.join_token_fd) or None
    if args.join_token_file:
        try:
            return state.read_secret_file(args.join_token_file)
        except (OSError, ValueError) as exc:
            raise Fatal(f"--join-token-file: {exc}") from None
    if args.join_token == "-":
        return sys.stdin.readline().strip() or None
    return from_env or None


def inventory_from(args: argparse.Namespace) -> Inventory:
    price = args.price_per_gpu_hour
    if price is not None and not 0 <= price <= 1e6:
        raise Fatal(f"--price-per-gpu-hour must be a number from 0 to 1000000, not {price!r}")
    inventory = _inventory_from(args)
    inventory.price_per_gpu_hour = price
    return inventory


def _inventory_from(args: argparse.Namespace) -> Inventory:
    if args.simulate:
        try:
            spec = parse_spec(args.simulate)
        except SpecError as exc:
            raise Fatal(f"bad --simulate spec {args.simulate!r}: {exc}") from None
        return simulated_inventory(args.name, spec)
    try:
        model_map = ModelMap.from_file(args.model_map)
        labels = parse_labels(args.labels)
    except (ValueError, SpecError) as exc:
        raise Fatal(str(exc)) from None
    try:
        inventory = nvml_inventory(args.name, model_map, args.nvlink)
    except NoGPUs as exc:
        raise Fatal(f"{exc}. Use --simulate SPEC for a node without GPUs.") from None
    inventory.rack, inventory.labels = args.rack, labels
    return inventory


def register(
    client: AgentClient,
    inventory: Inventory,
    metrics_url: str,
    token: str | None,
    state_dir: Path,
    timeout: float,
    address: str = "",
) -> tuple[dict[Any, Any], float]:
    """Register (retrying while the server cannot be reached); the answer, and when the request
    that succeeded was sent (``time.monotonic()``): the lease counts from there."""
    stored = state.read_credential(state_dir)
    if token is None and stored is None:
        raise Fatal(f"no join token: set ${TOKEN_ENV}, or use --join-token-file PATH or --join-token -")
    client.credential = stored
    deadline = time.monotonic() + timeout
    delay = 0.5
    while True:
        sent_at = time.monotonic()
        try:
            answer = client.register(inventory.register_body(metrics_url, address), token)
            break
        except Rejected as exc:
            raise Fatal(f"the server refused to register {inventory.name!r}: {exc}") from None
        except ServerError as exc:
            if time.monotonic() > deadline:
                raise Fatal(f"could not reach the server: {exc}", 1) from None
            log.warning("server not answering yet (%s); retrying", exc)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
    state.write_credential(state_dir, answer["credential"])
    return answer, sent_at


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    reexec_without_literal_token(argv)
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s agent: %(message)s")
    try:
        return run(args)
    except Fatal as exc:
        print(f"tessera-agent: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:  # Ctrl-C before the loop started: nothing runs yet
        print("tessera-agent: interrupted", file=sys.stderr)
        return 130


def route_address(server: str) -> str:
    """This machine's address on its route to the server: where the nodes of one network reach
    each other ('' if there is no route yet; the server then gives jobs the node's name)."""
    url = urlsplit(server)
    try:
        with socket.socket(
            socket.AF_INET6 if ":" in (url.hostname or "") else socket.AF_INET, socket.SOCK_DGRAM
        ) as s:
            s.connect((url.hostname or "localhost", url.port or 80))  # UDP: nothing is sent
            return str(s.getsockname()[0])
    except OSError:
        return ""


def signal_named(name: str) -> int:
    """``SIGUSR1``, ``USR1`` or ``10`` → the signal's number (else :class:`Fatal`)."""
    text = name.strip().upper()
    try:
        return int(
            signal.Signals(int(text))
            if text.isdigit()
            else signal.Signals[text if text.startswith("SIG") else f"SIG{text}"]
        )
    except (KeyError, ValueError):
        raise Fatal(f"--checkpoint-signal: {name!r} is not a signal (e.g. SIGUSR1)") from None


def checkpoint_root_of(value: str) -> Path | None:
    """The shared checkpoint root (None: node-local); it must exist: a missing mount would
    otherwise put checkpoints on the node's own disk under the mount point, unshared."""
    if not value:
        return None
    root = Path(value).resolve()
    if not root.is_dir():
        raise Fatal(f"--checkpoint-root {value}: not a directory (is it mounted?)")
    return root


def checkpoint_root_name(name: str, root: Path | None) -> str:
    """What the node registers as its checkpoint root: ``name``, else the shared root's path;
    "" for node-local checkpoints."""
    if root is None:
        if name:
            raise Fatal("--checkpoint-root-name names a shared --checkpoint-root: give that too")
        return ""
    shared_as = name or str(root)
    if len(shared_as) > 256 or not shared_as.isprintable():
        raise Fatal(f"--checkpoint-root-name {shared_as[:64]!r}: at most 256 printable characters")
    return shared_as


def run(args: argparse.Namespace) -> int:
    if not args.server:
        raise Fatal("--server URL is required (or set $TESSERA_SERVER)")
    server = urllib.parse.urlsplit(args.server)
    if server.scheme not in ("http", "https") or not server.hostname:
        # Not a server that is down: retrying it for --register-timeout only hid the typo.
        raise Fatal(f"--server {args.server!r}: expected http://HOST[:PORT] or https://HOST[:PORT]")
    if not 0.01 <= args.poll_interval <= 60 or args.util_speed <= 0 or not 0 <= args.metrics_port < 65536:
        raise Fatal("--poll-interval must be 0.01..60, --util-speed > 0, --metrics-port 0..65535")
    if not 0 <= args.wait_timeout <= 55:
        raise Fatal("--wait-timeout must be 0..55 seconds")
    if args.checkpoint_retention_hours < 0:
        raise Fatal("--checkpoint-retention-hours must be >= 0")
    checkpoint_signal = signal_named(args.checkpoint_signal)
    checkpoint_root = checkpoint_root_of(args.checkpoint_root)
    shared_as = checkpoint_root_name(args.checkpoint_root_name, checkpoint_root)
    if any(not 0 < port < 65536 for port in args.allow_local_port):
        raise Fatal("--allow-local-port must be 1..65535")
    if args.job_max_tasks is not None and args.job_max_tasks < 16:
        raise Fatal("--job-max-tasks must be at least 16")
    if args.job_disk_mb is not None and args.job_disk_mb < 1:
        raise Fatal("--job-disk-mb must be at least 1")
    if args.job_max_files is not None and args.job_max_files < 100:
        raise Fatal("--job-max-files must be at least 100")
    if args.job_log_buffer_mb < 1:
        raise Fatal("--job-log-buffer-mb must be at least 1")
    token = join_token(args)
    inventory = inventory_from(args)
    inventory.checkpoint_root = shared_as  # the server then knows which nodes reach a checkpoint
    try:
        users = identity.users_for(args.single_tenant, args.run_as, args.job_uids)
    except (ValueError, OSError) as exc:
        raise Fatal(f"cannot run jobs isolated: {exc}") from None
    if not users.isolated:
        log.warning(
            "--single-tenant: every job runs as %s and can read, signal and overwrite every other; "
            "do not share this node between tenants",
            users.probe().name,
        )
    state_dir = state.prepare_state_dir(args.state_dir or state.default_state_dir(args.name))
    # Before registering: the server then settles this node's old replicas as lost and hands
    # their GPUs on, so whatever a previous run of the agent left must be dead first.
    try:
        leftovers.kill_leftovers(state_dir)
    except leftovers.LeftoversRemain as exc:
        raise Fatal(str(exc), 4) from None
    state.clean_jobs(state_dir)
    # Checkpoints past their retention go once the server says their jobs cannot resume: the
    # running agent asks (agent/node.py), so none is removed before it has registered.
    retention_s = args.checkpoint_retention_hours * 3600
    probe = users.probe()
    if not runs_as(["/bin/sh", "-c", 'cd "$0"', str(state_dir / "jobs")], probe):
        raise Fatal(
            f"user {probe.name} cannot reach {state_dir}/jobs (a parent directory is not "
            "traversable): choose another --state-dir"
        )
    devices = {d.index: d.device_file for d in inventory.devices if d.device_file}
    path = job_path(state_dir, probe)
    max_tasks = args.job_max_tasks or sandbox.default_max_tasks()
    hide = [*sandbox.HIDDEN, *args.hide_path]
    kept: list[str | Path] = [state_dir, *path.split(":"), *([checkpoint_root] if checkpoint_root else [])]
    disk_mb = args.job_disk_mb or sandbox.default_disk_mb(state_dir)
    # Not set: the node's jobs share half its free space (and inodes), each its part of it.
    disk_pool = None if args.job_disk_mb else sandbox.disk_pool_mb(state_dir)
    size = sandbox.NodeSize(int(inventory.memory_gib * 1024), len(inventory.devices), inventory.cpus)
    if users.isolated and (why := protect_from_oom()) is not None:
        log.warning(
            "the kernel's OOM killer may pick the agent (and so end every job) when a job fills "
            "the node's memory: cannot lower its oom_score_adj: %s",
            why,
        )
    max_files = args.job_max_files or sandbox.default_max_files(state_dir)
    files_pool = None if args.job_max_files else sandbox.files_pool(state_dir)
    box = sandbox.detect(
        devices, users.isolated, kept, max_tasks, hide, disk_mb, size, max_files, disk_pool, files_pool
    )
    walls = firewall.detect(users.ids, args.allow_local_port) if isinstance(users, identity.UidPool) else None
    if isinstance(users, identity.UidPool):
        users.watcher = walls
    walled = walls is not None
    if args.require_isolation and not (users.isolated and box.namespaces and walled and box.scoped):
        raise Fatal(
            "--require-isolation: jobs would not be isolated (see the warnings above: a uid per job "
            "needs root, private mounts need namespaces, the loopback rules need nftables, the "
            "Landlock domains Linux 6.12)"
        )
    agent = Agent(
        AgentClient(args.server),
        inventory,
        state_dir,
        users,
        path,
        poll_interval=args.poll_interval,
        cgroups=cgroups.detect(),
        sandbox=box,
    )
    agent.checkpoint_retention_s = retention_s if checkpoint_root is None else None
    agent.checkpoint_root, agent.checkpoint_signal = checkpoint_root, checkpoint_signal
    agent.log_buffer_bytes = args.job_log_buffer_mb << 20
    agent.wait_timeout = args.wait_timeout
    agent.push = args.wait_timeout > 0
    agent.stream = agent.push and not args.no_stream

    try:
        trace = UtilProfiles.check() if inventory.simulated else None
    except (OSError, ValueError, KeyError) as exc:
        raise Fatal(f"cannot read the GPU utilisation trace for simulated GPUs: {exc}") from None
    profiles = functools.partial(UtilProfiles.load, trace) if trace is not None else None
    collector = GpuCollector(
        inventory, agent.gpu_uses, profiles, args.util_speed, None if inventory.simulated else nvml_reader()
    )
    agent.utilisation = collector.report
    try:
        server = serve(make_registry(collector), args.metrics_port, args.metrics_addr)
    except OSError as exc:
        raise Fatal(f"cannot serve metrics on {args.metrics_addr}:{args.metrics_port}: {exc}") from None
    host = args.advertise_host or (
        args.metrics_addr if args.metrics_addr not in ("0.0.0.0", "::") else socket.gethostname()
    )
    metrics_url = f"http://{host}:{server.server_port}/metrics"

    address = args.address or args.advertise_host or route_address(args.server)
    answer, agent.last_ok = register(
        agent.client, inventory, metrics_url, token, state_dir, args.register_timeout, address
    )
    agent.lease_seconds = float(answer.get("lease_seconds", agent.lease_seconds))
    log.info(
        "registered %s (%d GPUs, %s) as node %s; metrics at %s; jobs run as %s, spawned %s",
        inventory.name,
        len(inventory.devices),
        "simulated" if inventory.simulated else "NVML",
        answer["node"],
        metrics_url,
        f"uids {args.job_uids}, one per job" if users.isolated else probe.name,
        "through setpriv" if sandbox.setpriv() else "by fork (no setpriv with --pdeathsig here)",
    )

    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: stopping (jobs are stopped; the server requeues them after their lease)", signum)
        stop.set()
        agent.poke()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    code = 0
    try:
        agent.run(stop)
    except CredentialRevoked as exc:
        print(
            f"tessera-agent: the server no longer accepts this node's credential ({exc}); "
            "register again with a join token",
            file=sys.stderr,
        )
        code = 3
    finally:
        agent.shutdown(args.shutdown_grace)
        leftovers.tidy(state_dir)
        if walls is not None:
            walls.close()
        server.shutdown()
        server.server_close()
    return code
