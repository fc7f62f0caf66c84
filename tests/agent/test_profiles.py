"""The synthetic utilisation profiles (agent/profiles.py) have the shapes docs/metrics.md gives."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent import profiles
from agent.metrics import util_profile

IDLE_PCT = 5.0  # the idle policy's default threshold, in percent


def longest_idle_run(name: str, job_id: int, minutes: int, rank: int = 0) -> int:
    run = best = 0
    for m in range(minutes):
        run = run + 1 if profiles.util(name, job_id, m, rank) < IDLE_PCT else 0
        best = max(best, run)
    return best


@given(job_id=st.integers(1, 10**6))
def test_busy_bursty_and_stalling_jobs_are_never_idle_for_fifteen_minutes(job_id):
    for name in ("busy", "bursty"):
        assert longest_idle_run(name, job_id, 240) == 0
    assert 0 < longest_idle_run("stalling", job_id, 240) < 15


@given(job_id=st.integers(1, 10**6), after=st.integers(0, 300))
def test_idle_after_n_is_busy_for_n_minutes_then_idle(job_id, after):
    assert all(profiles.util(f"idle-after-{after}", job_id, m) >= 80 for m in range(after))
    assert all(profiles.util(f"idle-after-{after}", job_id, m) < IDLE_PCT for m in range(after, after + 90))


def test_half_idle_leaves_even_ranked_gpus_busy_and_odd_ones_idle():
    values = [profiles.util("half-idle-after-10", 7, 30, rank) for rank in range(4)]
    assert values[0] >= 80 and values[2] >= 80
    assert values[1] < IDLE_PCT and values[3] < IDLE_PCT


def test_the_same_job_looks_the_same_everywhere():
    assert [profiles.util("bursty", 42, m) for m in range(50)] == [
        profiles.util("bursty", 42, m) for m in range(50)
    ]


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"TESSERA_UTIL_PROFILE": "idle-after-30"}, "idle-after-30"),
        ({"TESSERA_UTIL_PROFILE": "sometimes"}, ""),
        ({"TESSERA_UTIL_PROFILE": 3}, ""),
        ({}, ""),
        ("not a map", ""),
    ],
)
def test_a_job_picks_a_profile_by_its_env_and_an_unknown_one_falls_back_to_the_trace(env, expected):
    assert util_profile({"env": env}) == expected


def test_an_unknown_profile_is_refused():
    with pytest.raises(ValueError, match="unknown"):
        profiles.util("sleepy", 1, 0)
