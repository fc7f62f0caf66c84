"""The knobs an operator may set live: each read from its text (an environment variable) or its
JSON value (the scheduler-settings record), and a bad one refused with its name."""

from __future__ import annotations

import math

import pytest

from scheduling.engine.config import KNOBS, EngineConfig, KnobError, configure

GOOD = {
    "alpha": ("0.5", 0.5),
    "beta": (1, 1.0),
    "gamma": ("inf", math.inf),
    "delta": ("0", 0.0),
    "aging_s": ("7200", 7200.0),
    "starve_s": (0, 0.0),
    "reclaim_after_s": ("60", 60.0),
    "reclaim_checkpoint_window_s": (0.0, 0.0),
    "room_hold_s": ("10", 10.0),
    "preempt_min_run_s": ("30", 30.0),
    "spare_ending_s": ("0", 0.0),
    "max_reservations": ("0", 0),
    "default_runtime_s": ("600", 600.0),
    "min_split_gpus": ("4", 4),
    "kind_accelerators": ('{"inference": ["T4", "A100"]}', (("inference", ("T4", "A100")),)),
    "preemptor_levels": ("[0, 1]", (0, 1)),
    "backfill": ("off", False),
    "preemption": (False, False),
    "exclusive_gpu_shares": ("on", True),
}


def test_every_knob_is_listed_here() -> None:
    assert set(GOOD) == set(KNOBS)


@pytest.mark.parametrize("knob", KNOBS)
def test_each_knob_is_set_from_its_text_or_value(knob: str) -> None:
    raw, value = GOOD[knob]
    config = configure(EngineConfig(), {knob: raw})
    assert getattr(config, knob) == value
    assert configure(EngineConfig(), {}) == EngineConfig()


@pytest.mark.parametrize(
    ("knob", "raw"),
    [
        ("alpha", "cheap"),
        ("beta", "nan"),
        ("starve_s", "-1"),
        ("default_runtime_s", "0"),
        ("room_hold_s", "inf"),
        ("max_reservations", "2.5"),
        ("min_split_gpus", "6"),
        ("backfill", "maybe"),
        ("preemption", 1.5),
        ("exclusive_gpu_shares", "tenants"),
        ("kind_accelerators", '["T4"]'),
        ("kind_accelerators", '{"inference": "T4"}'),
        ("preemptor_levels", "[true]"),
        ("preemptor_levels", "{"),
        ("theta", "1"),
    ],
)
def test_a_bad_value_is_refused_naming_its_knob_and_nothing_is_applied(knob: str, raw: object) -> None:
    with pytest.raises(KnobError) as refused:
        configure(EngineConfig(), {"alpha": "2", knob: raw})
    assert refused.value.knob == knob
    assert str(refused.value).startswith(f"{knob}: ")
