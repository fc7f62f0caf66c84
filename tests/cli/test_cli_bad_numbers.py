"""Numbers the ``tessera`` command cannot send: NaN and infinity (on the line, or in a job file's
YAML, ``.nan`` / ``.inf``) are bad input, exit 200 with one line naming them, before anything is
sent; never a "request failed" and exit 202 as if the server could not be reached, and never a
wait or a watch that NaN seconds make end at once or never.
"""

from __future__ import annotations

import pytest
from tessera_cli import outcome

NOWHERE = "http://127.0.0.1:9"  # the discard port: nothing answers


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
def test_nan_or_infinity_on_the_line_is_bad_input(run_tessera, args):
    result = run_tessera(NOWHERE, *args)
    assert result.returncode == outcome.BAD_INPUT, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and "request to" not in result.stderr, result.stderr
    assert any(word in result.stderr for word in ("nan", "inf", "1e400")), result.stderr


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
def test_nan_or_infinity_in_a_job_file_is_bad_input(run_tessera, tmp_path, value):
    job = tmp_path / "job.yaml"
    job.write_text(f"name: j\nkind: batch\ncommand: [true]\ngpus: 1\ncpus: {value}\n")
    result = run_tessera(NOWHERE, "submit", str(job))
    assert result.returncode == outcome.BAD_INPUT, (result.stdout, result.stderr)
    assert result.stderr.startswith("tessera: ") and result.stderr.count("\n") == 1, result.stderr
    assert "request to" not in result.stderr, result.stderr
