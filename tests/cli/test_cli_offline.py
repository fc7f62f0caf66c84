"""The ``tessera`` client's parts that need no server: its import boundary, its exit codes, the
idempotency key it derives in CI, and the job files it reads."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tessera_cli import idempotency, jobfile, outcome
from tessera_cli.errors import CliError, describe_api_error

ROOT = Path(__file__).resolve().parents[2]
SERVER_PACKAGES = ("django", "rest_framework", "channels", "celery", "scheduling", "controlplane")

# Any import of a server package fails, as it would where only the client is installed.
POISONED = f"""
import sys
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {SERVER_PACKAGES!r}:
            raise ImportError("the client imported " + name)
sys.meta_path.insert(0, Refuse())
from tessera_cli.main import main
code = main(["--help"])
loaded = sorted(m for m in sys.modules if m.split(".")[0] in {SERVER_PACKAGES!r})
print("LOADED", loaded)
sys.exit(code)
"""


def test_the_client_runs_without_importing_any_server_package():
    result = subprocess.run([sys.executable, "-c", POISONED], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "LOADED []" in result.stdout
    assert "Exit codes" in result.stdout


def test_the_client_package_depends_on_no_server_package():
    project = tomllib.loads((ROOT / "clients/cli/pyproject.toml").read_text())["project"]
    names = {dep.split(">")[0].split("<")[0].split("=")[0].strip().lower() for dep in project["dependencies"]}
    assert names == {"click", "requests", "pyyaml"}


def test_every_reserved_code_is_documented_in_the_readme_and_the_cli_doc():
    readme = (ROOT / "README.md").read_text()
    doc = (ROOT / "docs/cli.md").read_text()
    for code, _ in outcome.TABLE[2:]:
        assert f"| {code} |" in readme and f"| {code} |" in doc, code


def job(state, exit_code=None, **_):
    return {"state": state, "exit_code": exit_code}


@pytest.mark.parametrize(
    "state, exit_code, events, expected",
    [
        ("succeeded", 0, [], ("succeeded", 0)),
        ("failed", 3, [{"type": "failed", "reason": "exit 3"}], ("failed", 3)),
        ("failed", -9, [{"type": "failed", "reason": "exit -9"}], ("failed", 137)),
        ("failed", -15, [{"type": "failed", "reason": "time-limit"}], ("time-limit", 211)),
        ("failed", -9, [{"type": "failed", "reason": "disk-limit"}], ("disk-limit", 215)),
        ("failed", None, [{"type": "failed", "reason": "node-lost"}], ("node-lost", 213)),
        ("failed", None, [{"type": "failed", "reason": "lost"}], ("failed", 214)),
        ("cancelled", None, [{"type": "cancelled"}], ("cancelled", 210)),
    ],
)
def test_a_jobs_end_maps_to_its_exit_code_or_a_reserved_one(state, exit_code, events, expected):
    ended = outcome.outcome_of(job(state, exit_code), events)
    assert (ended.name, ended.code) == expected


def test_the_reserved_codes_are_distinct_and_above_the_signal_range():
    codes = [code for code, _ in outcome.TABLE[2:]]
    assert len(set(codes)) == len(codes) and min(codes) > 128 + 64


CI_ENV = st.dictionaries(
    st.sampled_from(
        ["GITHUB_RUN_ID", "GITHUB_RUN_ATTEMPT", "GITHUB_JOB", "GITHUB_ACTION", "GITHUB_REPOSITORY"]
    ),
    st.text(min_size=1, max_size=20),
)


@settings(suppress_health_check=[HealthCheck.too_slow])  # text draws are slow on a loaded CI machine
@given(CI_ENV, st.text(min_size=1), st.text(min_size=1))
def test_a_derived_key_is_stable_for_a_step_and_differs_between_bodies(env, a, b):
    env = {**env, "GITHUB_ACTIONS": "true", "GITHUB_RUN_ID": env.get("GITHUB_RUN_ID", "1")}
    key = idempotency.derive(env, a)
    assert key == idempotency.derive(dict(env), a)
    assert key is not None and key.isascii() and key.isprintable() and len(key) <= 255
    assert (key == idempotency.derive(env, b)) == (a == b)


def test_two_steps_of_one_run_never_share_a_key_and_a_retried_gitlab_job_keeps_its_own():
    gitlab = {"GITLAB_CI": "true", "CI_PROJECT_ID": "7", "CI_PIPELINE_ID": "99", "CI_JOB_NAME": "train"}
    key = idempotency.derive({**gitlab, "CI_JOB_ID": "1001"}, "body")
    assert key == idempotency.derive({**gitlab, "CI_JOB_ID": "1002"}, "body")  # the retry
    assert key != idempotency.derive({**gitlab, "CI_JOB_NAME": "eval"}, "body")
    jenkins = {"JENKINS_URL": "http://ci", "BUILD_TAG": "jenkins-train-12", "STAGE_NAME": "gpu"}
    assert idempotency.derive(jenkins, "body") != idempotency.derive({**jenkins, "STAGE_NAME": "x"}, "body")
    assert idempotency.derive({}, "body") is None


@pytest.mark.parametrize(
    "limits, expected",
    [
        ({"nvidia.com/gpu": 4}, {"gpus": 4}),
        ({"nvidia.com/gpu": "0.5"}, {"gpus": 0.5}),
        ({"cpu": "500m", "memory": "512Mi"}, {"cpus": 0.5, "memory_gib": 0.5}),
        ({"memory": "2G"}, {"memory_gib": round(2e9 / 2**30, 6)}),
    ],
)
def test_kubernetes_resource_limits_become_the_api_fields(limits, expected):
    body = jobfile.translate({"name": "x", "resources": {"limits": limits}})
    assert body == {"name": "x", **expected}


def test_an_unknown_resource_is_refused_naming_it():
    with pytest.raises(CliError) as refused:
        jobfile.translate({"resources": {"limits": {"google.com/tpu": 1}}})
    assert "google.com/tpu" in refused.value.message and refused.value.code == outcome.BAD_INPUT


def test_api_errors_read_as_one_line_naming_each_field():
    assert describe_api_error(400, {"gpus": ["must be at most 4096"]}) == "gpus: must be at most 4096"
    assert describe_api_error(404, {"detail": "No such job."}) == "No such job."
    assert describe_api_error(400, {"elastic": {"min_gpus": ["bad"]}}) == "elastic: min_gpus: bad"
    assert describe_api_error(502, "<html>\nBad gateway") == "<html>"


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("name: 2024-01-01\n", "name"),
        ("env: {BUILT: 2024-01-01 10:00:00}\n", "env.BUILT"),
        ("command: [run, !!binary aGk=]\n", "command[1]"),
        ("name: j\n1: x\n", "1"),
        ("cpus: .nan\n", "cpus"),
        ("env: {A: [1, .inf]}\n", "env.A[1]"),
    ],
)
def test_a_job_file_value_json_cannot_carry_is_refused_naming_where_it_is(text, field):
    with pytest.raises(CliError) as refused:
        jobfile.parse(text.encode(), "job.yaml")
    assert refused.value.code == outcome.BAD_INPUT
    assert refused.value.message.startswith(f"job.yaml: {field}: "), refused.value.message


@pytest.mark.parametrize("raw", ["²", "١", "1²", "０"])
def test_a_job_id_is_ascii_digits_only(raw):
    from tessera_cli.context import job_ids

    with pytest.raises(CliError) as refused:
        job_ids((raw,))
    assert refused.value.code == outcome.BAD_INPUT and "is not a job id" in refused.value.message


@pytest.mark.parametrize(
    "url", ["http://[::1", "http://host:99999", "http://host:port", "https://", "http://exa mple.com"]
)
def test_a_malformed_server_url_is_bad_input_not_an_unreachable_server(url):
    from tessera_cli.config import normal_url

    with pytest.raises(CliError) as refused:
        normal_url(url)
    assert refused.value.code == outcome.BAD_INPUT
    assert "server URL" in str(refused.value)


@pytest.mark.parametrize("token", ["tsr_a\nb", "tsr a", "tsr_\u00e9", " \t"])
def test_a_token_that_cannot_be_one_is_an_authentication_failure_not_an_unreachable_server(
    run_tessera, token
):
    """A CI secret pasted with a line break inside (or one left blank) used to fail as "request
    failed" with exit 202, which a pipeline treats as the server being down and retries."""
    done = run_tessera("http://127.0.0.1:9", "status", "1", env={"TESSERA_TOKEN": token})
    assert done.returncode == 201, done.stderr
    assert done.stderr.startswith("tessera: ") and "token" in done.stderr and "Traceback" not in done.stderr


def test_a_token_with_its_trailing_newline_is_used_without_it(run_tessera):
    done = run_tessera("http://127.0.0.1:9", "status", "1", env={"TESSERA_TOKEN": "tsr_test\n"})
    assert done.returncode == 202 and "cannot reach" in done.stderr  # sent: the port is closed


def test_login_refuses_a_token_that_cannot_be_one_before_sending_it(run_tessera):
    done = run_tessera(
        "http://127.0.0.1:9", "login", "--url", "http://127.0.0.1:9", "--token-stdin", stdin="tsr a\n"
    )
    assert done.returncode == 201 and "the token given is not a token" in done.stderr, done.stderr
