"""Numbers the ``tessera`` command cannot send: NaN and infinity (on the line, or in a job file's
YAML, ``.nan`` / ``.inf``) are bad input, exit 200 with one line naming them, before anything is
sent; never a "request failed" and exit 202 as if the server could not be reached, and never a
wait or a watch that NaN seconds make end at once or never.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tessera_cli import outcome

CLIENT = Path(__file__).resolve().parents[2] / "clients" / "cli"
NOWHERE = "http://127.0.0.1:9"  # the discard port: nothing answers


def tessera(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TESSERA_", "GITHUB_", "CI_"))}
    env.update(
        TESSERA_URL=NOWHERE,
        TESSERA_TOKEN="tsr_test",
        TESSERA_RETRIES="0",
        TESSERA_CONFIG=str(tmp_path / "config.json"),
        PYTHONPATH=str(CLIENT),  # this checkout's client, wherever the installed one came from
    )
    code = "import sys; from tessera_cli.main import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    "args",
    [
        ["submit", "--gpus", "nan", "--", "true"],
        ["submit", "--gpus", "inf", "--", "true"],
        ["submit", "--gpus", "1e400", "--", "true"],
        ["submit", "--wait", "--wait-timeout", "nan", "--", "true"],
        ["submit", "--wait", "--wait-timeout", "inf", "--", "true"],
        ["watch", "--timeout", "nan"],
        ["watch", "--timeout", "inf"],
    ],
    ids=lambda a: " ".join(a),
)
def test_nan_or_infinity_on_the_line_is_bad_input(tmp_path, args):
    result = tessera(tmp_path, *args)
    assert result.returncode == outcome.BAD_INPUT, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and "request to" not in result.stderr, result.stderr
    assert any(word in result.stderr for word in ("nan", "inf", "1e400")), result.stderr


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
def test_nan_or_infinity_in_a_job_file_is_bad_input(tmp_path, value):
    job = tmp_path / "job.yaml"
    job.write_text(f"name: j\nkind: batch\ncommand: [true]\ngpus: 1\ncpus: {value}\n")
    result = tessera(tmp_path, "submit", str(job))
    assert result.returncode == outcome.BAD_INPUT, (result.stdout, result.stderr)
    assert result.stderr.startswith("tessera: ") and result.stderr.count("\n") == 1, result.stderr
    assert "request to" not in result.stderr, result.stderr
