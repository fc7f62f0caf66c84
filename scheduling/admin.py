"""The operators' console (Django admin) for every model of the scheduling app.

Read-mostly: what the scheduler and agents own (jobs, allocations, events, devices, logs) is shown,
never edited by hand. The writes an operator does make go through the services, like the API's:
quotas (``services.quotas``), cancelling jobs (``do_cancel_job``), join tokens
(``services.agents``), cordoning nodes and revoking tokens (``services.operators``). The admin is
for staff only, and its job and tenant lists go through the same ``visible_to`` querysets as the API.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any, cast

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import Count, QuerySet
from django.http import HttpRequest
from django.utils import timezone

from scheduling.api.fields import is_printable
from scheduling.api.quotas import MAX_GPUS, MAX_WEIGHT
from scheduling.engine.adjust import OverrideRefused
from scheduling.engine.config import KNOBS
from scheduling.models import (
    AdjustmentState,
    Allocation,
    ApiToken,
    AuditEntry,
    Device,
    EngineMemoryRecord,
    IdempotencyKey,
    Job,
    JobEvent,
    JoinToken,
    LogChunk,
    Membership,
    Node,
    Quota,
    SchedulerSettings,
    SchedulerState,
    Tenant,
    Webhook,
    WebhookDelivery,
)
from scheduling.services import operators
from scheduling.services.agents import do_create_join_token
from scheduling.services.idle_policy import check_idle_overrides, do_set_idle_overrides
from scheduling.services.jobs import do_cancel_job
from scheduling.services.knobs import check_knobs, do_save_scheduler_settings, knobs_of
from scheduling.services.quotas import (
    QuotaExists,
    check_quota,
    do_create_quota,
    do_delete_quota,
    do_update_quota,
)
from scheduling.services.tokens import do_revoke_api_token
from scheduling.states import InvalidTransition


def fingerprint(obj: Any, fields: Iterable[str]) -> str:
    """A digest of ``obj``'s values of ``fields``, as stored."""
    values = {name: obj._meta.get_field(name).value_from_object(obj) for name in fields}
    return hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()[:32]


class NoLostUpdate(forms.ModelForm):
    """A change page carries a digest of the values it was shown (``seen``, hidden); saving is
    refused when the stored values no longer match (another operator, or another tab, saved
    since), rather than silently putting back the values this page still holds. ``watched``: the
    fields the page edits. A post without ``seen`` (not from the page) is not checked."""

    watched: tuple[str, ...] = ()
    seen = forms.CharField(widget=forms.HiddenInput, required=False)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk is not None:
            self.fields["seen"].initial = fingerprint(self.instance, self.watched)

    def clean(self) -> dict[str, Any]:
        cleaned = cast(dict[str, Any], super().clean())  # a ModelForm's clean: its cleaned_data
        seen = cleaned.get("seen")
        # The instance still holds the stored values here (the form's are put on it after clean).
        if seen and self.instance.pk is not None and seen != fingerprint(self.instance, self.watched):
            raise ValidationError(
                "This was changed since you opened this page (by another operator, or in another "
                "tab): nothing was saved. Reload the page to see the values now, then make your "
                "change again."
            )
        return cleaned


class ReadOnlyMixin:
    """Shown, never edited here: the rows belong to the scheduler, the agents or the services."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ReadOnlyInline(ReadOnlyMixin, admin.TabularInline):
    extra = 0
    can_delete = False
    show_change_link = False


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


class TenantForm(NoLostUpdate):
    """The idle-policy overrides checked as the API checks them (the operator's bounds)."""

    watched = ("name", "idle_policy")

    class Meta:
        model = Tenant
        fields = ["name", "idle_policy"]

    def clean_idle_policy(self) -> dict[str, float]:
        overrides = self.cleaned_data.get("idle_policy")
        try:
            # Blank is none; anything else is checked as given ("[]" or "0" is not an object).
            return check_idle_overrides({} if overrides is None else overrides)
        except OverrideRefused as exc:
            raise ValidationError(str(exc)) from None


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    """Tenants; a change of the idle-policy overrides goes through ``services.idle_policy``."""

    form = TenantForm
    list_display = ["name", "member_count", "job_count", "created_at"]
    search_fields = ["name"]
    inlines = [MembershipInline]

    def save_model(self, request: HttpRequest, obj: Tenant, form: Any, change: bool) -> None:
        overrides = obj.idle_policy
        obj.idle_policy = Tenant.objects.get(pk=obj.pk).idle_policy if change else {}
        super().save_model(request, obj, form, change)
        if overrides != obj.idle_policy:
            obj.idle_policy = do_set_idle_overrides(obj, overrides, request.user).idle_policy

    def get_queryset(self, request: HttpRequest) -> QuerySet[Tenant]:
        return Tenant.objects.visible_to(request.user).annotate(
            members_n=Count("members", distinct=True), jobs_n=Count("jobs", distinct=True)
        )

    @admin.display(description="members", ordering="members_n")
    def member_count(self, tenant: Tenant) -> int:
        return tenant.members_n  # type: ignore[attr-defined]  # annotated by get_queryset

    @admin.display(description="jobs", ordering="jobs_n")
    def job_count(self, tenant: Tenant) -> int:
        return tenant.jobs_n  # type: ignore[attr-defined]  # annotated by get_queryset


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "tenant"]
    list_filter = ["tenant"]
    search_fields = ["user__username", "tenant__name"]
    autocomplete_fields = ["user", "tenant"]
    list_select_related = ["user", "tenant"]


def printable_model(value: str) -> None:
    if not is_printable(value):
        raise ValidationError("must not contain control or invisible characters")


ONE_PER_MODEL = next(c for c in Quota._meta.constraints if c.name == "one_quota_per_tenant_model")


class QuotaForm(NoLostUpdate):
    """The API's checks in the console: its bounds (GPUs and weight up to a million, a weight above
    0, a model name of printable characters); a model that matches a known one only by case is
    refused; an unknown model, or guarantees above the cluster's capacity, are saved with a
    warning."""

    watched = ("guaranteed", "limit", "weight")
    # Set (on a subclass, by QuotaAdmin.get_form) when this tenant's row for the model was saved by
    # someone else after this form's uniqueness check had passed: refused beside ``model``.
    taken = False
    model = forms.CharField(max_length=64, validators=[printable_model], strip=False)
    guaranteed = forms.FloatField(min_value=0, max_value=MAX_GPUS)
    limit = forms.FloatField(min_value=0, max_value=MAX_GPUS)
    weight = forms.FloatField(min_value=0, max_value=MAX_WEIGHT, initial=1.0)

    class Meta:
        model = Quota
        fields = ["tenant", "model", "guaranteed", "limit", "weight"]

    def clean_weight(self) -> float:
        weight = self.cleaned_data["weight"]
        if weight <= 0:
            raise ValidationError("must be greater than 0")
        return weight

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        self.warnings: list[str] = []
        if self.taken:
            self.add_error("model", ONE_PER_MODEL.violation_error_message or "one quota per tenant and model")
        model = data.get("model", self.instance.model if self.instance.pk else None)
        guaranteed, limit = data.get("guaranteed"), data.get("limit")
        if model is None or guaranteed is None or limit is None:
            return data
        advice = check_quota(model, guaranteed, limit, self.instance if self.instance.pk else None)
        for field, problems in advice.errors.items():
            self.add_error(field if field in self.fields else None, problems)
        self.warnings = advice.warnings
        return data


@admin.register(Quota)
class QuotaAdmin(admin.ModelAdmin):
    """Quotas: every save and delete goes through ``services.quotas`` (which asks for a pass)."""

    form = QuotaForm
    list_display = ["tenant", "model", "guaranteed", "limit", "weight"]
    list_filter = ["tenant", "model"]
    search_fields = ["tenant__name", "model"]
    list_select_related = ["tenant"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Quota]:
        return super().get_queryset(request).filter(tenant__in=Tenant.objects.visible_to(request.user))

    def get_readonly_fields(self, request: HttpRequest, obj: Quota | None = None) -> list[str]:
        return ["tenant", "model"] if obj is not None else []  # as in the API: delete and re-create

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: Any = None,
    ) -> Any:
        try:
            return super().changeform_view(request, object_id, form_url, extra_context)
        except QuotaExists:
            # Another operator's row for this (tenant, model) landed between the form's
            # uniqueness check and the save (the unique constraint caught it, and the view's
            # transaction was rolled back): the same form again, refused beside ``model``.
            request.quota_taken = True  # type: ignore[attr-defined]  # read by get_form
            return super().changeform_view(request, object_id, form_url, extra_context)

    def get_form(
        self, request: HttpRequest, obj: Quota | None = None, change: bool = False, **kwargs: Any
    ) -> Any:
        form = super().get_form(request, obj, change, **kwargs)
        if getattr(request, "quota_taken", False):
            return type(form.__name__, (form,), {"taken": True})
        return form

    def save_model(self, request: HttpRequest, obj: Quota, form: Any, change: bool) -> None:
        numbers = {"guaranteed": obj.guaranteed, "limit": obj.limit, "weight": obj.weight}
        if change:
            do_update_quota(obj, by=request.user, **numbers)
        else:
            created = do_create_quota(obj.tenant, obj.model, **numbers, by=request.user)
            obj.pk = created.pk
        for warning in getattr(form, "warnings", []):  # once saved: a refused save has none
            messages.warning(request, warning)

    def delete_model(self, request: HttpRequest, obj: Quota) -> None:
        do_delete_quota(obj, by=request.user)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Quota]) -> None:
        for quota in queryset:
            do_delete_quota(quota, by=request.user)


class JoinTokenForm(forms.ModelForm):
    """A new token's expiry must lie ahead (one in the past was made a token valid for a second),
    and its name and node-name patterns be printable (an invisible character, a right-to-left
    override, made a pattern look like ``gpu-*`` and cover no node)."""

    class Meta:
        model = JoinToken
        fields = ["name", "max_nodes", "names", "expires_at", "revoked"]

    def clean_expires_at(self) -> Any:
        expires_at = self.cleaned_data.get("expires_at")
        if self.instance.pk is None and expires_at is not None and expires_at <= timezone.now():
            raise ValidationError("must be in the future: a token that has expired registers nothing")
        return expires_at

    def clean_name(self) -> str:
        name = self.cleaned_data.get("name") or ""
        printable_model(name)
        return name

    def clean_names(self) -> str:
        names = self.cleaned_data.get("names") or ""
        printable_model(names)
        return names


@admin.register(JoinToken)
class JoinTokenAdmin(admin.ModelAdmin):
    """Join tokens: made here or by ``manage.py create_join_token``; the secret is shown once."""

    form = JoinTokenForm
    list_display = ["__str__", "names", "registrations", "max_nodes", "created_at", "expires_at", "revoked"]
    list_filter = ["revoked"]
    search_fields = ["name", "names"]
    fields = [
        "name",
        "max_nodes",
        "names",
        "expires_at",
        "revoked",
        "registrations",
        "created_by",
        "created_at",
    ]
    readonly_fields = ["registrations", "created_by", "created_at"]
    actions = ["revoke"]

    def save_model(self, request: HttpRequest, obj: JoinToken, form: Any, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return

        hours = None
        if obj.expires_at is not None:
            hours = max((obj.expires_at - timezone.now()).total_seconds() / 3600, 1 / 3600)
        token, raw = do_create_join_token(obj.name, hours, obj.max_nodes, obj.names, request.user)
        obj.pk, obj.token_hash, obj.created_at = token.pk, token.token_hash, token.created_at
        messages.warning(request, f"Join token for agents (shown only now; only its hash is kept): {raw}")

    @admin.action(description="Revoke the selected join tokens")
    def revoke(self, request: HttpRequest, queryset: QuerySet[JoinToken]) -> None:
        n = operators.do_revoke_join_tokens(queryset.values_list("pk", flat=True), by=request.user)
        self.message_user(request, f"{n} token(s) revoked.")


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyMixin, admin.ModelAdmin):
    """The audit log: who changed what, with the values before and after. Read only."""

    list_display = ["at", "actor", "action", "object_repr", "before", "after"]
    list_filter = ["action", "object_type"]
    search_fields = ["actor", "object_repr", "object_id", "note"]
    date_hierarchy = "at"


@admin.register(ApiToken)
class ApiTokenAdmin(ReadOnlyMixin, admin.ModelAdmin):
    """People's API tokens: listed (never their keys: only prefixes and hashes are kept) and
    revoked here; their owners make them through the API."""

    list_display = ["name", "user", "prefix", "created_at", "last_used_at"]
    search_fields = ["name", "user__username", "prefix"]
    exclude = ["key_hash"]
    list_select_related = ["user"]

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.is_staff)

    def delete_model(self, request: HttpRequest, obj: ApiToken) -> None:
        do_revoke_api_token(obj, by=request.user)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        for token in queryset:
            do_revoke_api_token(token, by=request.user)


class DeviceInline(ReadOnlyInline):
    model = Device
    fields = ["index", "model", "uuid", "memory_gib", "nvlink_island", "healthy"]


class NodeForm(NoLostUpdate):
    """The price within the bounds the agents' registration accepts (a negative one had reached
    ``do_set_node_price`` and answered 500; 1e308 was stored)."""

    watched = ("price_per_gpu_hour",)
    price_per_gpu_hour = forms.FloatField(min_value=0, max_value=operators.MAX_PRICE_PER_GPU_HOUR)

    class Meta:
        model = Node
        fields = ["price_per_gpu_hour"]


@admin.register(Node)
class NodeAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = ["name", "rack", "kind", "state", "gpu_count", "last_heartbeat", "held_reason", "version"]
    list_filter = ["state", "rack", "kind"]
    search_fields = ["name", "rack"]
    exclude = ["credential_hash"]  # a hash, but still nothing an operator needs to see
    form = NodeForm
    inlines = [DeviceInline]
    actions = ["cordon", "uncordon", "join_token_for_names"]

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.is_superuser  # its price only: the rest belongs to its agent

    def get_readonly_fields(self, request: HttpRequest, obj: Node | None = None) -> list[str]:
        return [f.name for f in Node._meta.fields if f.name not in ("price_per_gpu_hour", "credential_hash")]

    def save_model(self, request: HttpRequest, obj: Node, form: Any, change: bool) -> None:
        operators.do_set_node_price(obj, obj.price_per_gpu_hour, by=request.user)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Node]:
        return super().get_queryset(request).annotate(gpus_n=Count("devices"))

    @admin.display(description="GPUs", ordering="gpus_n")
    def gpu_count(self, node: Node) -> int:
        return node.gpus_n  # type: ignore[attr-defined]  # annotated by get_queryset

    @admin.action(description="Cordon: take no new jobs (running ones continue)")
    def cordon(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        n = operators.do_cordon_nodes(queryset.values_list("pk", flat=True), by=request.user)
        self.message_user(request, f"{n} node(s) cordoned.")

    @admin.action(description="Uncordon: schedulable again (approves a node held for an operator)")
    def uncordon(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        n = operators.do_uncordon_nodes(queryset.values_list("pk", flat=True), by=request.user)
        self.message_user(request, f"{n} node(s) uncordoned.")

    @admin.action(description="Make a join token to register these names on new machines (24 h)")
    def join_token_for_names(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        names = sorted(queryset.values_list("name", flat=True))
        _, raw = do_create_join_token(
            "re-register " + ", ".join(names)[:50], 24, len(names), ",".join(names)[:256], request.user
        )
        messages.warning(
            request,
            "Join token for " + ", ".join(names) + " (each may register once, once its node has been "
            f"silent past its lease; shown only now): {raw}",
        )


@admin.register(Device)
class DeviceAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = ["__str__", "node", "index", "model", "memory_gib", "nvlink_island", "healthy"]
    list_filter = ["model", "healthy", "node__rack"]
    search_fields = ["uuid", "node__name", "model"]
    list_select_related = ["node"]


ALLOCATION_FIELDS = ("device", "replica", "share_milli", "attempt", "created_at", "released_at")
JOB_EVENT_FIELDS = ("type", "at", "reason", "allocations")


class AllocationInline(ReadOnlyInline):
    model = Allocation
    fields = readonly_fields = ALLOCATION_FIELDS

    def get_queryset(self, request: HttpRequest) -> QuerySet[Allocation]:
        return super().get_queryset(request).select_related("node", "device")


class JobEventInline(ReadOnlyInline):
    model = JobEvent
    fields = readonly_fields = JOB_EVENT_FIELDS


@admin.register(Job)
class JobAdmin(ReadOnlyMixin, admin.ModelAdmin):
    """Jobs are read here; the one change an operator makes is to cancel them."""

    list_display = [
        "id",
        "name",
        "tenant",
        "kind",
        "state",
        "gpus",
        "replicas",
        "queue_level",
        "priority",
        "pending_code",
        "attempts",
        "submitted_at",
    ]
    list_filter = ["state", "kind", "queue_level", "pending_code", "tenant"]
    search_fields = ["=id", "name", "tenant__name", "owner__username"]
    list_select_related = ["tenant"]
    date_hierarchy = "submitted_at"
    inlines = [AllocationInline, JobEventInline]
    actions = ["cancel"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Job]:
        return Job.objects.visible_to(request.user).select_related("tenant", "owner")

    @admin.action(description="Cancel the selected jobs")
    def cancel(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        done, refused = 0, []
        for job_id in queryset.values_list("pk", flat=True):
            try:
                do_cancel_job(job_id, by=request.user)
                done += 1
            except InvalidTransition:
                refused.append(str(job_id))
        self.message_user(request, f"{done} job(s) cancelled or being stopped.")
        if refused:
            self.message_user(
                request, "Already finished, not cancelled: " + ", ".join(refused), level=messages.WARNING
            )


@admin.register(Allocation)
class AllocationAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = ["job", "device", "replica", "share_milli", "attempt", "created_at", "released_at"]
    list_filter = [("released_at", admin.EmptyFieldListFilter)]
    search_fields = ["=job__id", "node__name"]
    list_select_related = ["job", "node", "device"]


@admin.register(JobEvent)
class JobEventAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = ["job", "type", "at", "reason"]
    list_filter = ["type"]
    search_fields = ["=job__id", "reason"]
    list_select_related = ["job"]
    date_hierarchy = "at"


@admin.register(LogChunk)
class LogChunkAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = ["job", "replica", "offset"]
    search_fields = ["=job__id"]
    exclude = ["data"]  # bytes; read them through /api/v1/jobs/{id}/logs/
    list_select_related = ["job"]


@admin.register(IdempotencyKey)
class IdempotencyKeyAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = ["key", "user", "job", "created_at"]
    search_fields = ["key", "user__username"]
    exclude = ["body_hash"]
    list_select_related = ["user", "job"]


@admin.register(SchedulerState)
class SchedulerStateAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = ["__str__", "last_pass_at", "last_pass_seconds", "last_pass_decisions"]


@admin.register(AdjustmentState)
class AdjustmentStateAdmin(ReadOnlyMixin, admin.ModelAdmin):
    """The adjustment pass's last run: whether it could read utilisation, and why not."""

    list_display = ["__str__", "metrics_ok", "problem", "idle_gpus", "actions_total"]


@admin.register(EngineMemoryRecord)
class EngineMemoryRecordAdmin(ReadOnlyMixin, admin.ModelAdmin):
    """What the last pass's engine left for the next (its reservations, held rooms, request mix)."""

    list_display = ["__str__", "updated_at", "not_reached"]


class DefaultOrYesNo(forms.NullBooleanSelect):
    """A boolean knob's choices: blank says what it means (the environment's default), where
    Django's select said "Unknown", as if the scheduler's own setting were not known."""

    def __init__(self, attrs: dict[str, Any] | None = None) -> None:
        super().__init__(attrs)
        self.choices = [("unknown", "— the environment's default"), ("true", "Yes"), ("false", "No")]


class SchedulerSettingsForm(NoLostUpdate):
    watched = KNOBS

    class Meta:
        model = SchedulerSettings
        fields = list(KNOBS)
        widgets = {knob: DefaultOrYesNo for knob in ("backfill", "preemption", "exclusive_gpu_shares")}

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        error = check_knobs(knobs_of(cleaned))  # the whole record, on top of the environment's
        if error is not None:
            raise ValidationError({error.knob: error.message})
        return cleaned


@admin.register(SchedulerSettings)
class SchedulerSettingsAdmin(admin.ModelAdmin):
    """The scheduler's knobs (blank: the environment's default); operators only, checked whole
    before saving, effective from the next pass (``services/knobs.py``)."""

    form = SchedulerSettingsForm
    list_display = ["__str__", "updated_by", "updated_at"]
    readonly_fields = ["updated_by", "updated_at"]

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.is_superuser and not SchedulerSettings.objects.exists()

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.is_superuser

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: SchedulerSettings, form: Any, change: bool) -> None:
        do_save_scheduler_settings(obj, request.user)


@admin.register(Webhook)
class WebhookAdmin(admin.ModelAdmin):
    """Tenants' webhooks: made through the API (its target checks); here read and deleted."""

    list_display = ["tenant", "url", "events", "created_by", "created_at"]
    list_filter = ["tenant"]
    readonly_fields = ["tenant", "url", "events", "created_by", "created_at"]
    exclude = ["secret"]
    list_select_related = ["tenant", "created_by"]

    def has_add_permission(self, request) -> bool:
        return False


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(admin.ModelAdmin):
    """Deliveries: written by ``services.webhooks`` only."""

    list_display = [
        "id",
        "webhook",
        "event",
        "state",
        "attempts",
        "last_status",
        "created_at",
        "delivered_at",
    ]
    list_filter = ["state", "event"]
    readonly_fields = [f.name for f in WebhookDelivery._meta.fields]
    list_select_related = ["webhook__tenant"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False
