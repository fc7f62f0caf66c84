"""The portal's tokens page: a person's own named API tokens — list, make one (its key shown once,
on the page that made it), revoke. Writes go through ``scheduling.services.tokens``, as the API's
``/api/v1/tokens/`` does; forms are POSTs under Django's CSRF check."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods

from frontend.actions import post_action
from frontend.redaction import viewer_for
from scheduling.api.fields import text_problem
from scheduling.models import ApiToken
from scheduling.services.tokens import MAX_NAME, TokenNameTaken, do_create_api_token, do_revoke_api_token


@never_cache  # the page that shows a new key must not be kept by any cache
@require_http_methods(["GET", "POST"])
@login_required
def tokens(request: HttpRequest) -> HttpResponse:
    context = {"viewer": viewer_for(request.user), "max_name": MAX_NAME}
    status = 200
    if request.method == "POST":
        name = request.POST.get("name", "").strip()
        problem = text_problem(name) if name else "Give the token a name, e.g. ci or laptop."
        if problem is None and not name.isprintable():
            problem = "A name may hold only printable characters (no tabs or line breaks)."
        if problem is None and len(name) > MAX_NAME:
            problem = f"A name is at most {MAX_NAME} characters."
        if problem is None:
            try:
                token, key = do_create_api_token(request.user, name)
            except TokenNameTaken:
                problem = f"You already have a token named “{name}”: revoke it or choose another name."
            else:
                context["new_token"], context["new_key"] = token, key
        if problem:
            context["error"], context["typed"] = problem, name
            status = 400
    context["tokens"] = ApiToken.objects.filter(user=request.user.pk).order_by("id")
    return render(request, "frontend/tokens.html", context, status=status)


@post_action(lambda request, pk: reverse("tokens"))
@login_required
def token_revoke(request: HttpRequest, pk: int) -> HttpResponse:
    token = ApiToken.objects.filter(user=request.user.pk, pk=pk).first()
    if token is None:
        raise Http404("No such token.")
    do_revoke_api_token(token)
    messages.success(request, f"Token “{token.name}” revoked: its key no longer works.")
    return redirect("tokens")
