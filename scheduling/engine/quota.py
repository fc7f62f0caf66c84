"""Quotas per tenant and model (docs/api.md): guaranteed, limit, weight; borrowing; fair share.

* A tenant's row for a model applies to it; the ``*`` row covers every model without its own row
  (usage on all of those models is summed against it); no row: the tenant may not use the model.
* Usage counts a fraction as its share and a whole-GPU replica as the buddy block it takes.
* Above the guarantee a tenant borrows; only preemptible jobs may borrow, so borrowed capacity can
  always be given back by preemption. The guarantee goes to a tenant's non-preemptible jobs
  first: one starts while the tenant's non-preemptible usage stays within the guarantee (and its
  total within the limit), its preemptible jobs then being the ones that borrow — so an inference
  service never waits for its own tenant's batch work to be preempted.
* Fair share = allocated GPUs / guaranteed GPUs (summed over models) / weight; lowest first.
Without any quota rows every tenant is unlimited with weight 1.
"""

from __future__ import annotations

from collections.abc import Iterable

from .types import MILLI, QuotaSpec

#: How a refusal names the room its tenant's aged jobs ahead of the job hold on the row this pass
#: (waiting for nodes, they will start on it): held, not used, and the tenant's own jobs.
HELD_FOR_AGED = "held for its aged jobs ahead of it in the queue"


def fmt_gpus(milli: int | float) -> str:
    value = milli / MILLI
    return f"{value:g}" if value == int(value) else f"{value:.2f}"


class Quotas:
    def __init__(self, specs: Iterable[QuotaSpec]):
        self.rows: dict[str, dict[str, QuotaSpec]] = {}
        for q in specs:
            self.rows.setdefault(q.tenant, {})[q.model] = q
        self.enabled = bool(self.rows)
        self.usage: dict[tuple[str, str], int] = {}  # (tenant, row model) -> milli-GPU
        self.fixed: dict[tuple[str, str], int] = {}  # the part held by non-preemptible jobs
        self.total: dict[str, int] = {}  # tenant -> milli-GPU over all models
        # Rows (tenant, row model) whose room is being freed, for one pass, for a waiting
        # non-preemptible job (row -> that job): the tenant's later jobs may not grow them, since
        # each would only be the next job preempted to make that room.
        self.frozen: dict[tuple[str, str], str] = {}
        # The part of ``usage`` (and of ``fixed``) that is not use but room claimed, for one pass,
        # for aged jobs waiting for nodes (row -> milli-GPU): a refusal's words count it apart.
        self.claims: dict[tuple[str, str], int] = {}
        self.fixed_claims: dict[tuple[str, str], int] = {}
        self.version = 0  # moves with every change of usage (answers may be kept until it does)

    def row(self, tenant: str, model: str) -> QuotaSpec | None:
        rows = self.rows.get(tenant)
        if rows is None:
            return None
        return rows.get(model) or rows.get("*")

    def row_key(self, tenant: str, model: str) -> tuple[str, str]:
        rows = self.rows.get(tenant, {})
        return (tenant, model if model in rows else "*")

    def used(self, tenant: str, model: str) -> int:
        return self.usage.get(self.row_key(tenant, model), 0)

    def add(self, tenant: str, model: str, milli: int, preemptible: bool = True) -> None:
        key = self.row_key(tenant, model)
        self.version += 1
        self.usage[key] = self.usage.get(key, 0) + milli
        self.total[tenant] = self.total.get(tenant, 0) + milli
        if not preemptible:
            self.fixed[key] = self.fixed.get(key, 0) + milli

    def claim(self, tenant: str, model: str, milli: int, preemptible: bool = True) -> None:
        """Charge ``milli`` to the row as room held for an aged job of ``tenant`` that waits for
        nodes (negative: give it back). It refuses as use does; a refusal names it apart."""
        key = self.row_key(tenant, model)
        self.add(tenant, model, milli, preemptible)
        self.claims[key] = self.claims.get(key, 0) + milli
        if not preemptible:
            self.fixed_claims[key] = self.fixed_claims.get(key, 0) + milli

    def fixed_used(self, tenant: str, model: str) -> int:
        """What ``tenant``'s non-preemptible jobs hold on ``model``'s row."""
        return self.fixed.get(self.row_key(tenant, model), 0)

    def check(self, tenant: str, model: str, milli: int, preemptible: bool) -> tuple[str, str] | None:
        """None if ``tenant`` may take ``milli`` more on ``model``, else (code, message)."""
        if not self.enabled or milli == 0:
            return None
        rows = self.rows.get(tenant)
        q = None if rows is None else rows.get(model) or rows.get("*")
        if q is None:
            return ("quota", f"quota: {tenant} has no quota for {model}")
        key = (tenant, q.model)  # the row key: the model's own row or the * row
        used = self.usage.get(key, 0)
        if used + milli <= round(min(q.guaranteed, q.limit) * MILLI) and not self.frozen:
            return None  # the common case: within the guarantee, nothing frozen
        label = model if q.model != "*" else f"{model} (* row)"
        holder = self.frozen.get(key)
        if holder is not None:
            return ("quota", f"quota: {tenant}'s {label} quota is being freed for its job {holder}")
        if used + milli > round(q.limit * MILLI):
            held = self.claims.get(key, 0)
            if held:
                return (
                    "quota",
                    f"quota: {tenant} uses {fmt_gpus(used - held)} of {q.limit:g} {label}; "
                    f"{fmt_gpus(held)} {HELD_FOR_AGED}",
                )
            return ("quota", f"quota: {tenant} uses {fmt_gpus(used)} of {q.limit:g} {label} (limit)")
        fixed = self.fixed.get(key, 0)
        if not preemptible and fixed + milli > round(q.guaranteed * MILLI):
            held = self.fixed_claims.get(key, 0)
            also = f"; {fmt_gpus(held)} {HELD_FOR_AGED}" if held else ""
            return (
                "borrow-limit",
                f"borrow-limit: {tenant}'s non-preemptible jobs use {fmt_gpus(fixed - held)} of "
                f"{q.guaranteed:g} guaranteed {label}{also}; only preemptible jobs may borrow",
            )
        return None

    def ever_admits(self, tenant: str, model: str, milli: int, preemptible: bool) -> bool:
        if not self.enabled or milli == 0:
            return True
        q = self.row(tenant, model)
        if q is None:
            return False
        cap = q.limit if preemptible else q.guaranteed
        return milli <= round(cap * MILLI)

    def borrowed(self, tenant: str, model: str) -> int:
        q = self.row(tenant, model)
        if q is None:
            return 0
        return max(0, self.used(tenant, model) - round(q.guaranteed * MILLI))

    def under_guarantee(self, tenant: str, model: str, milli: int, preemptible: bool = True) -> bool:
        """Would ``tenant`` stay within its guarantee after taking ``milli`` more (for a
        non-preemptible job: its non-preemptible usage, which the guarantee serves first)?"""
        q = self.row(tenant, model)
        used = self.used(tenant, model) if preemptible else self.fixed_used(tenant, model)
        return q is not None and used + milli <= round(q.guaranteed * MILLI)

    def would_borrow(self, tenant: str, gpus: float) -> bool:
        """Would ``gpus`` more take ``tenant`` above its guarantee (summed over its rows)?"""
        if not self.enabled:
            return False
        guaranteed = sum(q.guaranteed for q in self.rows.get(tenant, {}).values())
        return self.total.get(tenant, 0) + gpus * MILLI > guaranteed * MILLI + 1e-6

    def share(self, tenant: str) -> float:
        """Weighted dominant share (GPUs are the dominant resource here)."""
        return self.total.get(tenant, 0) * self.share_per_milli(tenant)

    def share_per_milli(self, tenant: str) -> float:
        """What one milli-GPU of usage adds to ``tenant``'s share: 1 / guaranteed / weight."""
        rows = self.rows.get(tenant, {})
        guaranteed = sum(q.guaranteed for q in rows.values())
        weight = max((q.weight for q in rows.values()), default=1.0) or 1.0
        return 1.0 / MILLI / (guaranteed or 1.0) / weight
