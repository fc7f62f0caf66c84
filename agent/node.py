"""The agent's main loop: heartbeat, start what is bound here, stop what must stop, keep the lease.

Each heartbeat reports the processes running here and gets back the bindings to start and the
stop orders (docs/agent.md). Between heartbeats a second thread holds a websocket open
(``/api/v1/agent/stream``; the long-poll ``GET /api/v1/agent/wait`` where the server refuses it):
when the server has news for this node it pushes it at once, with the new bindings in it, which
the main loop starts at once; news that carries no bindings (a stop order) makes the agent
heartbeat immediately. Exit reports go on the same websocket while it is open. So work arrives
in milliseconds, not at the next poll. The periodic heartbeat remains, for the lease and as the
fallback when push fails.
Heartbeats are sent from a thread of their own, which hands their orders to the main loop: a slow
heartbeat (a busy server) never holds up the start of a pushed binding.
Processes are spawned by the main thread only: a job's parent-death signal follows the thread
that spawned it.
Starts are idempotent: a (job, attempt, replica) is started at most
once per agent life. Fencing: the lease runs out a lease period after the send of the last
heartbeat that succeeded; at that moment (the main loop's wait ends there, whatever it waits for)
every job is SIGKILLed, as by then the control plane may requeue them elsewhere, and no binding is
started until a heartbeat gets through again. A later heartbeat renews the lease for what runs
then; the killed jobs stay killed and are reported as exits (reason ``lost``).
"""

from __future__ import annotations

import logging
import random
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent import state
from agent.cgroups import AnyCgroups
from agent.client import AgentClient, Rejected, ServerError
from agent.errors import ServerBusy
from agent.identity import JobUsers, RunAs
from agent.inventory import Inventory
from agent.metrics import GpuUse, util_profile
from agent.process import MAX_BUFFER_BYTES, JobProcess
from agent.reports import ExitReporter
from agent.sandbox import Sandbox

log = logging.getLogger("tessera.agent")

Key = tuple[int, int, int]
HEARTBEAT_JITTER = 0.1  # each gap is the poll interval ± 10%: see heartbeat_gap
STREAM_IDLE_S = 60.0  # the agent pings every 30 s; a pong 30 s late means the stream is dead
STREAM_RETRY_S = 300.0  # after a refused stream handshake, the long-poll this long
HELD_RETRY_S = 0.05  # how soon a binding held back for its GPUs is tried again
# Rendezvous ports this agent gives jobs that lie on this node alone without a whole GPU (the
# server gives the others theirs: scheduling/services/rendezvous.py, from 29500 up).
LOCAL_PORTS = range(29400, 29500)
SWEEP_EVERY_S = 60.0  # checkpoint directories past their retention: looked for at most this often
ASK_AT_MOST = 1024  # jobs whose checkpoints one heartbeat asks about


def binding_key(binding: dict[str, Any]) -> Key:
    """(job, attempt, replica) of a binding: what is started at most once per agent life."""
    return int(binding["job_id"]), int(binding["attempt"]), int(binding.get("replica", 0))


def heartbeat_gap(poll_interval: float) -> float:
    """Seconds to the next periodic heartbeat: ``poll_interval`` ± ``HEARTBEAT_JITTER``, at random.

    Agents started together (a rack after a power cut, a deployment) would otherwise heartbeat
    together for ever, every poll interval a burst of requests on the web; random gaps spread
    them within a few intervals. The mean stays ``poll_interval``, far inside the lease."""
    return poll_interval * random.uniform(1 - HEARTBEAT_JITTER, 1 + HEARTBEAT_JITTER)


class CredentialRevoked(Exception):
    """The server no longer accepts this node's credential (re-registered elsewhere or removed)."""


class Agent:
    def __init__(
        self,
        client: AgentClient,
        inventory: Inventory,
        state_dir: Path,
        run_as: JobUsers | RunAs,
        job_path: str,
        poll_interval: float = 1.0,
        lease_seconds: float = 60.0,
        cgroups: AnyCgroups | None = None,
        sandbox: Sandbox | None = None,
    ):
        self.client, self.inventory, self.state_dir = client, inventory, state_dir
        self.reporter = ExitReporter(client)  # the jobs' exit reports, batched
        self.run_as, self.job_path = run_as, job_path
        self.poll_interval = poll_interval
        self.cgroups = cgroups
        self.sandbox = sandbox
        self.checkpoint_retention_s: float | None = None  # None: checkpoints are kept (tests)
        self.checkpoint_root: Path | None = None  # shared by the nodes (None: STATE/checkpoints)
        self.checkpoint_signal: int = signal.SIGUSR1  # "checkpoint now", before a preemption
        self.log_buffer_bytes = MAX_BUFFER_BYTES  # a replica's output not yet sent, at most
        # Per-GPU utilisation for the heartbeat (GpuCollector.report); None: report none. Sent
        # only while the server's last answer asked for it (``report_utilisation``: it reads the
        # agents' reports, not Prometheus).
        self.utilisation: Callable[[], list[dict[str, Any]]] | None = None
        self.report_utilisation = False
        self._swept_at = -float("inf")
        # Jobs whose checkpoints are past their retention, for the next heartbeat to ask about
        # (can they still resume?), and the answers for the main loop: (asked, the answer's list;
        # None from a server that does not say).
        self._ask: list[int] | None = None
        self._answered: list[tuple[list[int], list[dict[str, Any]] | None]] = []
        self.lease_seconds = lease_seconds
        self.jobs: dict[Key, JobProcess] = {}
        self.ever_started: set[Key] = set()
        self._resized_out: set[Key] = set()  # stopped by a shrink: may be started again once gone
        self._last_attempt: dict[tuple[int, int], int] = {}  # (job, replica): latest attempt started
        self._lock = threading.Lock()
        self.last_ok = time.monotonic()  # the send time of the last heartbeat that succeeded
        self._fenced: set[Key] = set()  # killed when the lease ran out
        self.push = True  # False once the server is found to have no long-poll endpoint
        self.stream = True  # push over the websocket (agent/stream.py), the long-poll where refused
        self._stream_retry_at = 0.0
        self.wait_timeout = 25.0
        self._poke = threading.Event()  # wakes the main loop
        self._beat = threading.Event()  # asks the heartbeat thread for a heartbeat now
        self._pushed: list[dict[str, Any]] = []  # bindings a wake carried, for the main loop
        self._orders: list[tuple[float, dict[str, Any]]] = []  # (send time, heartbeat answer)
        # Bindings whose GPUs a process of another job still uses (see :meth:`_gpus_in_use`), with
        # when they were held back: started once that process is gone.
        self._held: dict[Key, tuple[float, dict[str, Any]]] = {}
        self._revoked: CredentialRevoked | None = None

    # --- what the metrics and the heartbeat read ------------------------------------------------

    def running_reports(self) -> list[dict[str, int]]:
        """The heartbeat's ``running``: see :attr:`JobProcess.reported_running`."""
        with self._lock:
            return [
                {"job_id": p.job_id, "attempt": p.attempt, "replica": p.replica, "pid": p.pid}
                for p in self.jobs.values()
                if p.reported_running
            ]

    def utilisation_report(self) -> list[dict[str, Any]]:
        """The heartbeat's ``utilisation`` (:meth:`GpuCollector.report`); [] before metrics exist
        or when reading them fails (a heartbeat is never held up by its metrics)."""
        if self.utilisation is None or not self.report_utilisation:
            return []
        try:
            return self.utilisation()
        except Exception:  # noqa: BLE001 - NVML or a profile failing must not stop the lease
            log.warning("utilisation report failed", exc_info=True)
            return []

    def gpu_uses(self) -> dict[int, list[GpuUse]]:
        now = time.monotonic()
        uses: dict[int, list[GpuUse]] = {}
        with self._lock:
            live = [p for p in self.jobs.values() if p.holds_gpus]
        for p in live:
            profile = util_profile(p.binding)
            for index, gpu in enumerate(p.gpus):
                rank = p.replica * len(p.gpus) + index
                use = GpuUse(p.job_id, now - p.started_at, p.share, profile, rank)
                uses.setdefault(gpu, []).append(use)
        return uses

    # --- the loop -----------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Start what is pushed or ordered, fence, reap, until ``stop`` is set; heartbeats go every
        ``poll_interval``, and at once when asked, from a thread of their own."""
        if self.push:
            threading.Thread(target=self._listen, args=(stop,), name="agent-wait", daemon=True).start()
        threading.Thread(target=self._heartbeats, args=(stop,), name="agent-heartbeat", daemon=True).start()
        while not stop.is_set():
            self._poke.clear()
            with self._lock:
                pushed, self._pushed = self._pushed, []
                orders, self._orders = self._orders, []
            if self._revoked is not None:
                raise self._revoked
            for sent_at, answer in orders:
                self._drop_unordered(sent_at, answer)
                self.apply(answer)
            self._sweep_answered()
            if pushed:
                self.apply({"start": pushed, "stop": []})
            if self._held:
                self.apply({"start": [b for _, b in self._held.values()], "stop": []})
            self._fence_if_expired()
            self._reap()
            # Held bindings are tried again soon: their GPUs' old process is being stopped.
            self._poke.wait(min(self._wait_s(), HELD_RETRY_S) if self._held else self._wait_s())

    def _heartbeats(self, stop: threading.Event) -> None:
        failures = 0
        next_heartbeat = time.monotonic()
        while not stop.is_set():
            self._beat.wait(max(0.0, next_heartbeat - time.monotonic()))
            self._beat.clear()
            if stop.is_set():
                return
            sent_at = time.monotonic()
            next_heartbeat = sent_at + heartbeat_gap(self.poll_interval)
            try:
                failures = self._heartbeat(sent_at, failures)
            except CredentialRevoked as exc:
                self._revoked = exc
                self._poke.set()
                return

    def _heartbeat(self, sent_at: float, failures: int) -> int:
        """One heartbeat; its orders go to the main loop. Returns the failures in a row so far."""
        with self._lock:
            asked = self._ask
        try:
            orders = self.client.heartbeat(
                self.running_reports(), self.utilisation_report(), checkpoints=asked
            )
        except Rejected as exc:
            if exc.status in (401, 403):
                if self._adopt_stored_credential():
                    self._beat.set()  # heartbeat again now, with it
                    return failures
                raise CredentialRevoked(str(exc)) from None
            log.error("heartbeat refused: %s", exc)
            return failures
        except ServerError as exc:
            failures += 1
            if failures in (1, 10) or failures % 60 == 0:
                log.warning("heartbeat failed (%d in a row): %s", failures, exc)
            return failures
        self.last_ok = sent_at  # the lease counts from the send: the server's is later
        self.lease_seconds = float(orders.get("lease_seconds", self.lease_seconds))
        self.report_utilisation = bool(orders.get("report_utilisation", False))
        with self._lock:
            self._orders.append((sent_at, orders))
            if asked:
                answer = orders.get("checkpoints")
                self._answered.append((asked, answer if isinstance(answer, list) else None))
                if self._ask is asked:
                    self._ask = None
        self._poke.set()
        return 0

    def _adopt_stored_credential(self) -> bool:
        """Refused: whether ``STATE/credential`` holds another credential than the one in use
        (an operator rotated it, ``manage.py rotate_node_credential``), now in use. The jobs keep
        running; the stream, closed by the server, reopens with it."""
        stored = state.read_credential(self.state_dir)
        if stored is None or stored == self.client.credential:
            return False
        self.client.credential = stored
        log.warning("the server refused this node's credential: using the new one in %s", self.state_dir)
        return True

    def _listen(self, stop: threading.Event) -> None:
        """Hold the stream (or, where the server refuses it, the long-poll) open; hand what the
        server pushes to the main loop."""
        errors = 0
        while not stop.is_set():
            if self.stream and time.monotonic() >= self._stream_retry_at:
                errors = self._stream_session(stop, errors)
                continue
            answer: dict[str, Any] = {}
            try:
                answer = self.client.wait(self.wait_timeout)
            except Rejected as exc:
                if exc.status in (404, 405):
                    log.warning("the server has no push endpoint; polling every %gs", self.poll_interval)
                    self.push = False
                    return
                errors += 1
            except ServerError as exc:
                errors += 1
                if errors in (1, 10) or errors % 60 == 0:
                    log.warning("long-poll failed (%d in a row): %s", errors, exc)
            else:
                errors = 0
            if errors:
                # The wait failed (a Redis hiccup, a restarted web process): a wake may have been
                # lost with it, so fetch the orders now rather than at the next periodic heartbeat.
                self._beat.set()
            if answer.get("wake"):
                self._woken(answer)
            elif errors:
                stop.wait(min(5.0, 0.5 * errors))  # the server is down: do not spin

    def _stream_session(self, stop: threading.Event, errors: int) -> int:
        """Open the websocket and hand its wakes on until it ends; the failures in a row so far.

        While it is open, exit reports go on it too (agent/reports.py). A refused handshake (a
        server without the stream) means the long-poll for ``STREAM_RETRY_S``; a failure, another
        try after a pause that grows, with a heartbeat now, as a wake may have been missed."""
        stream, before = None, errors
        try:
            stream = self.client.open_stream(STREAM_IDLE_S)
            errors = 0
            self.reporter.stream = stream
            self._beat.set()  # wakes published while no socket was open: the heartbeat has them
            while not stop.is_set():
                self._woken(stream.receive())
        except Rejected as exc:
            log.warning("the server refused the stream (%s): long-poll for %gs", exc, STREAM_RETRY_S)
            self._stream_retry_at = time.monotonic() + STREAM_RETRY_S
        except ServerError as exc:
            # Opened and at once told "try again later" (4013): not a good session. Counted as
            # one, it reset the count, and the agent reopened and heartbeated without a pause.
            errors = (before if isinstance(exc, ServerBusy) else errors) + 1
            if errors in (1, 10) or errors % 60 == 0:
                log.warning("stream failed (%d in a row): %s", errors, exc)
            self._beat.set()
            stop.wait(min(5.0, 0.5 * (errors - 1)))  # at once after a good session; then slower
        finally:
            self.reporter.stream = None
            if stream is not None:
                stream.close()
        return errors

    def _woken(self, answer: dict[str, Any]) -> None:
        """A wake (the long-poll's answer, or a stream message): its bindings to the main loop at
        once; a wake without bindings (or from a server that sends none) asks for orders."""
        if not answer.get("wake"):
            return
        start = answer.get("start")
        if isinstance(start, list):
            with self._lock:
                self._pushed.extend(b for b in start if isinstance(b, dict))
            self._poke.set()
        if answer.get("heartbeat", True) or not isinstance(start, list):
            self._beat.set()

    def poke(self) -> None:
        """Heartbeat now, and wake the main loop (what a stop does, so the loop exits at once)."""
        self._beat.set()
        self._poke.set()

    def apply(self, orders: dict[str, Any]) -> None:
        """Stops first (an old attempt makes way for a new one), then starts."""
        for order in orders.get("stop", []):
            key = (int(order["job_id"]), int(order["attempt"]), int(order["replica"]))
            with self._lock:
                process = self.jobs.get(key)
                if process is not None and order.get("reason") == "resize":
                    # A shrink removed it: a later grow of the same attempt may bind the same
                    # replica here again, once this process has exited (see _reap).
                    self._resized_out.add(key)
            if process is not None:
                process.stop(str(order.get("reason") or "stopped"), float(order.get("grace_left_seconds", 0)))
        for world in orders.get("worlds", []):
            key = (int(world["job_id"]), int(world["attempt"]), int(world["replica"]))
            with self._lock:
                process = self.jobs.get(key)
            if process is not None:
                process.tell_world(world)
        for binding in orders.get("start", []):
            key = binding_key(binding)
            with self._lock:
                if key in self.jobs or key in self.ever_started:
                    continue
                if time.monotonic() >= self.lease_deadline():
                    # No lease: the server may already be requeueing this node's work. A heartbeat
                    # that gets through delivers the binding again, if it is still ours.
                    log.warning("lease expired: not starting job %s attempt %s replica %s", *key)
                    continue
                if self._last_attempt.get((key[0], key[2]), -1) > key[1]:
                    log.info("ignoring binding of job %s attempt %s: a later attempt ran here", *key[:2])
                    continue
                busy = self._gpus_in_use(binding)
                if busy:
                    self._hold(key, binding, busy)
                    continue
                self._held.pop(key, None)
                self.ever_started.add(key)
                self._last_attempt[(key[0], key[2])] = key[1]
                binding = self._with_port(binding)
                process = JobProcess(
                    binding,
                    self.reporter,
                    self.state_dir,
                    self.run_as,
                    self.job_path,
                    self.cgroups,
                    self.sandbox,
                    self.checkpoint_root,
                    self.checkpoint_signal,
                    self.log_buffer_bytes,
                )
                self.jobs[key] = process
            log.info("starting job %s attempt %s replica %s on GPUs %s", *key, binding.get("gpus"))
            process.start()

    def _with_port(self, binding: dict[str, Any]) -> dict[str, Any]:
        """The binding with a ``MASTER_PORT`` where the server left the choice here (a job on this
        node alone, without a whole GPU): the port another replica of its attempt has, else one of
        :data:`LOCAL_PORTS` no job running here has (call with the lock held)."""
        meet = binding.get("rendezvous")
        if not meet or meet.get("master_port"):
            return binding
        job, attempt = int(binding["job_id"]), int(binding["attempt"])
        taken: set[int] = set()
        for p in self.jobs.values():
            port = (p.binding.get("rendezvous") or {}).get("master_port")
            if not port or p.done.is_set():
                continue  # none, or its job has ended here
            if (p.job_id, p.attempt) == (job, attempt):
                return {**binding, "rendezvous": {**meet, "master_port": port}}
            taken.add(int(port))
        free = next((port for port in LOCAL_PORTS if port not in taken), None)
        if free is None:
            log.warning("job %s: no free rendezvous port in %s-%s", job, LOCAL_PORTS[0], LOCAL_PORTS[-1])
            return binding
        return {**binding, "rendezvous": {**meet, "master_port": free}}

    def _gpus_in_use(self, binding: dict[str, Any]) -> list[int]:
        """The binding's GPUs that processes still running here leave too little of (shares
        summed; call with the lock held). The server binds a GPU only once its last process has
        exited, so such a process is no longer bound there as the server sees it (a job stopped
        or settled while its start was on its way here): a GPU never runs two jobs' processes
        beyond its capacity, even then."""
        share = float(binding.get("share", 1.0))
        used: dict[int, float] = {}
        for p in self.jobs.values():
            if p.holds_gpus:
                for gpu in p.gpus:
                    used[gpu] = used.get(gpu, 0.0) + p.share
        return [int(g) for g in binding.get("gpus") or [] if used.get(int(g), 0.0) + share > 1.0 + 1e-6]

    def _hold(self, key: Key, binding: dict[str, Any], busy: list[int]) -> None:
        """Start ``binding`` once its GPUs are free; ask for a heartbeat now: its answer stops the
        processes that are not bound here any more (and drops the binding if it is not either)."""
        if key not in self._held:
            log.warning(
                "job %s attempt %s replica %s: GPUs %s are still used by a process the server no "
                "longer binds there; starting it once that one has exited",
                *key,
                busy,
            )
            self._held[key] = (time.monotonic(), binding)
            self._beat.set()

    def _drop_unordered(self, sent_at: float, answer: dict[str, Any]) -> None:
        """A heartbeat sent after a binding was held back lists every binding to start here: one
        it does not list was cancelled or moved meanwhile."""
        listed = {binding_key(b) for b in answer.get("start", [])}
        for key, (held_at, _) in list(self._held.items()):
            if sent_at > held_at and key not in listed:
                log.info("job %s attempt %s replica %s: no longer bound here; not starting it", *key)
                del self._held[key]

    def lease_deadline(self) -> float:
        """When the lease runs out (``time.monotonic()``): the last successful heartbeat's send
        time plus the lease. The server's own count starts when it received that heartbeat."""
        return self.last_ok + self.lease_seconds

    def _wait_s(self) -> float:
        """The main loop's wait: the poll interval, cut short so that a turn (and its fencing)
        comes at the lease's deadline, not up to a poll interval after it. Once it has run out,
        nothing is due until a heartbeat renews it (which wakes the loop)."""
        left = self.lease_deadline() - time.monotonic()
        return min(self.poll_interval, left) if left > 0 else self.poll_interval

    def _fence_if_expired(self) -> None:
        """The lease has run out: SIGKILL every job (each once). What a later heartbeat renews
        is the lease of what runs then; a killed job is reported as an exit (reason ``lost``)."""
        now = time.monotonic()
        if now < self.lease_deadline():
            return
        if self._held:
            # Not to be started without a lease; a heartbeat that gets through brings each
            # binding again if it is still this node's.
            log.warning("lease expired: dropping %d binding(s) held for their GPUs", len(self._held))
            self._held.clear()
        with self._lock:
            processes = [p for key, p in self.jobs.items() if key not in self._fenced]
            self._fenced.update(p.key for p in processes)
        if processes:
            log.error(
                "lease expired (no heartbeat for %.1fs, lease %gs): killing %d job(s)",
                now - self.last_ok,
                self.lease_seconds,
                len(processes),
            )
        for process in processes:
            process.stop("lease expired", 0)

    def _reap(self) -> None:
        with self._lock:
            ended = [k for k, p in self.jobs.items() if p.done.is_set()]
            for key in ended:
                del self.jobs[key]
                self._fenced.discard(key)
                if key in self._resized_out:
                    self._resized_out.discard(key)
                    self.ever_started.discard(key)
            running = {key[0] for key in self.jobs}
        now = time.monotonic()
        retention = self.checkpoint_retention_s
        if retention is not None and now - self._swept_at >= min(SWEEP_EVERY_S, retention):
            # Checkpoints past their retention go only once the server says their jobs cannot
            # resume: the next heartbeat asks (a directory's name holds its job id, and only the
            # agent makes them: no job chooses what is asked about).
            self._swept_at = now
            stale = sorted(state.stale_checkpoints(self.state_dir, retention, keep=running))
            with self._lock:
                self._ask = stale[:ASK_AT_MOST] or None

    def _sweep_answered(self) -> None:
        """Apply what heartbeats answered about checkpoints past their retention: a job the
        server says can still resume keeps its checkpoint, the others' go once the retention has
        passed since they ended (a job the server does not answer for: at once)."""
        with self._lock:
            answered, self._answered = self._answered, []
            running = {key[0] for key in self.jobs}
        retention = self.checkpoint_retention_s
        if retention is None:
            return
        for asked, answer in answered:
            if answer is None:  # a server that does not say: by time alone
                state.sweep_checkpoints(self.state_dir, retention, keep=running)
                continue
            ended: dict[int, float | None] = dict.fromkeys(asked, 0.0)
            for item in answer:
                if isinstance(item, dict) and item.get("job_id") in ended:
                    at = item.get("ended_at")  # anything but a time: it may resume (kept)
                    ended[item["job_id"]] = float(at) if isinstance(at, int | float) else None
            state.sweep_checkpoints(self.state_dir, retention, keep=running, ended=ended)

    def shutdown(self, grace_s: float) -> None:
        """Stop every job (SIGTERM, SIGKILL after at most ``grace_s``) without reporting exits.

        The control plane learns of it through the lease: the node goes not-ready and its jobs are
        requeued once their leases have expired (docs/agent.md, "Stopping the agent").
        """
        with self._lock:
            processes = list(self.jobs.values())
        for process in processes:
            process.silence()
            process.stop("shutdown", min(grace_s, float(process.binding.get("grace_seconds") or 0)))
        deadline = time.monotonic() + grace_s + 2.0
        for process in processes:
            process.done.wait(max(0.0, deadline - time.monotonic()))
