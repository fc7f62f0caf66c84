"""``tessera webhooks``: register URLs for job events, list them and their deliveries, delete
them, and send a delivery again (``/api/v1/webhooks/``)."""

from __future__ import annotations

import click

from tessera_cli import output
from tessera_cli.context import Context, job_ids, output_option, pass_ctx

EVENTS = ("succeeded", "failed", "cancelled", "preempted", "idle-warning")

HOOK_COLUMNS: list[output.Column] = [
    ("id", lambda h: h.get("id")),
    ("tenant", lambda h: h.get("tenant")),
    ("url", lambda h: h.get("url")),
    ("events", lambda h: ",".join(h.get("events") or []) or "all"),
    ("created", lambda h: (h.get("created_at") or "")[:19]),
]

DELIVERY_COLUMNS: list[output.Column] = [
    ("id", lambda d: d.get("id")),
    ("event", lambda d: d.get("event")),
    ("job", lambda d: (d.get("payload") or {}).get("job", {}).get("id")),
    ("state", lambda d: d.get("state")),
    ("attempts", lambda d: d.get("attempts")),
    ("status", lambda d: d.get("last_status")),
    ("error", lambda d: d.get("last_error") or None),
    ("created", lambda d: (d.get("created_at") or "")[:19]),
]


@click.group()
def webhooks() -> None:
    """Your tenant's webhooks: URLs that get signed deliveries of job events."""


@webhooks.command("ls")
@output_option
@pass_ctx
def list_hooks(ctx: Context, fmt):
    """The webhooks of your tenant (operators: every tenant's)."""
    output.emit(list(ctx.client.pages("webhooks/")), fmt, HOOK_COLUMNS)


@webhooks.command("add")
@click.argument("url")
@click.option(
    "--event",
    "-e",
    "events",
    multiple=True,
    type=click.Choice(EVENTS),
    help="An event to deliver (repeat); default: every one.",
)
@click.option("--tenant", help="Operators only: the tenant whose jobs' events are sent.")
@output_option
@pass_ctx
def add(ctx: Context, url, events, tenant, fmt):
    """Register URL for your jobs' events. The secret that signs the deliveries is printed once:
    keep it (the receiver checks the `Tessera-Signature` header with it)."""
    body: dict = {"url": url}
    if events:
        body["events"] = list(events)
    if tenant is not None:
        body["tenant"] = tenant
    _, hook = ctx.client.post("webhooks/", body)
    output.emit(hook, fmt)


@webhooks.command("rm")
@click.argument("ids", nargs=-1, required=True)
@pass_ctx
def remove(ctx: Context, ids):
    """Delete webhooks (their deliveries go with them)."""
    for hook in job_ids(ids, "webhook"):
        ctx.client.request("DELETE", f"webhooks/{hook}/")
        click.echo(f"webhook {hook} deleted", err=True)


@webhooks.command("deliveries")
@click.argument("hook_id")
@click.option("--limit", type=click.IntRange(1, 100_000), default=50, show_default=True)
@output_option
@pass_ctx
def deliveries(ctx: Context, hook_id, limit, fmt):
    """A webhook's deliveries, newest first: state, attempts, the receiver's last answer."""
    (hook,) = job_ids((hook_id,), "webhook")
    output.emit(list(ctx.client.pages(f"webhooks/{hook}/deliveries/", limit=limit)), fmt, DELIVERY_COLUMNS)


@webhooks.command("redeliver")
@click.argument("hook_id")
@click.argument("delivery_id")
@output_option
@pass_ctx
def redeliver(ctx: Context, hook_id, delivery_id, fmt):
    """Send a delivery again, from its first attempt (a failed one too)."""
    (hook,) = job_ids((hook_id,), "webhook")
    (delivery,) = job_ids((delivery_id,), "delivery")
    _, answer = ctx.client.post(f"webhooks/{hook}/deliveries/{delivery}/redeliver/")
    output.emit(answer, fmt, DELIVERY_COLUMNS, [answer] if isinstance(answer, dict) else [])
