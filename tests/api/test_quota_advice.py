"""Quota rows are checked in sentences: a model that matches a known one only by case is refused;
an unknown model and guarantees above the cluster's capacity are kept with a warning — in the API
and in the admin alike. The cluster: n01 with 8 H100, n02 with 4 A100 (tests/api/conftest.py)."""

from __future__ import annotations

import pytest
from django.urls import reverse

from scheduling.models import Quota
from tests.api.helpers import post_json

QUOTAS = "/api/v1/quotas/"


def create(world, **body):
    return post_json(world.client("admin"), QUOTAS, {"tenant": "nlp", "guaranteed": 2, "limit": 4, **body})


@pytest.mark.parametrize("model", ["h100", "a100"])
def test_a_model_that_differs_only_by_case_is_refused_naming_the_right_one(world, cluster, model):
    response = create(world, model=model)
    assert response.status_code == 400
    [message] = response.json()["model"]
    assert f"did you mean “{model.upper()}”" in message
    assert not Quota.objects.filter(model=model).exists()


def test_an_unknown_model_is_kept_with_a_warning_naming_the_known_ones(world, cluster):
    response = create(world, model="B200")
    assert response.status_code == 201, response.json()
    [warning] = response.json()["warnings"]
    assert "“B200”" in warning and "A100, H100" in warning
    assert Quota.objects.filter(model="B200").exists()


def test_guarantees_above_the_models_capacity_are_kept_with_the_numbers(world, cluster):
    assert create(world, model="H100", guaranteed=6, limit=8).json()["warnings"] == []
    response = post_json(
        world.client("admin"), QUOTAS, {"tenant": "vision", "model": "H100", "guaranteed": 4, "limit": 8}
    )
    assert response.status_code == 201
    [warning] = response.json()["warnings"]
    assert "add up to 10 GPUs" in warning and "has 8" in warning


def test_raising_a_guarantee_past_capacity_warns_too(world, cluster):
    quota = create(world, model="A100", guaranteed=2, limit=4).json()
    response = world.client("admin").generic(
        "PATCH",
        f"{QUOTAS}{quota['id']}/",
        b'{"guaranteed": 4.5, "limit": 5}',
        content_type="application/json",
    )
    assert response.status_code == 200
    assert "add up to 4.5 GPUs" in response.json()["warnings"][0]


@pytest.fixture
def console(world, client):
    client.force_login(world.admin)
    return client


def test_the_admin_refuses_a_case_only_model_with_the_same_sentence(console, world, cluster):
    response = console.post(
        reverse("admin:scheduling_quota_add"),
        {"tenant": world.nlp.pk, "model": "h100", "guaranteed": 1, "limit": 2, "weight": 1},
    )
    assert response.status_code == 200
    assert "did you mean “H100”" in response.content.decode()
    assert not Quota.objects.filter(model="h100").exists()


def test_the_admin_says_a_broken_rule_in_words_never_a_constraint_name(console, world, cluster):
    response = console.post(
        reverse("admin:scheduling_quota_add"),
        {"tenant": world.nlp.pk, "model": "H100", "guaranteed": 8, "limit": 4, "weight": 0},
    )
    page = response.content.decode()
    assert "must be at least the guarantee" in page and "greater than 0" in page
    assert "limit_ge_guaranteed" not in page and "weight_positive" not in page and "Constraint" not in page


def test_the_admin_keeps_an_unknown_model_and_warns(console, world, cluster):
    response = console.post(
        reverse("admin:scheduling_quota_add"),
        {"tenant": world.nlp.pk, "model": "B200", "guaranteed": 1, "limit": 2, "weight": 1},
        follow=True,
    )
    assert Quota.objects.filter(model="B200").exists()
    assert any("“B200”" in str(m) for m in response.context["messages"])
