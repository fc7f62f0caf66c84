"""Where the agent takes its join token from, and how a literal one leaves its command line."""

from __future__ import annotations

import io
import os

import pytest

from agent import cli


def args_for(*argv: str):
    return cli.build_parser().parse_args(["--server", "http://x", *argv])


@pytest.fixture(autouse=True)
def no_token_in_env(monkeypatch):
    monkeypatch.delenv(cli.TOKEN_ENV, raising=False)


def test_the_token_comes_from_the_environment_which_then_forgets_it(monkeypatch):
    monkeypatch.setenv(cli.TOKEN_ENV, " from-env \n")
    assert cli.join_token(args_for()) == "from-env"
    assert cli.TOKEN_ENV not in os.environ  # so nothing the agent starts inherits it


def test_a_token_file_or_stdin_wins_over_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(cli.TOKEN_ENV, "from-env")
    path = tmp_path / "token"
    path.write_text("from-file\n")
    assert cli.join_token(args_for("--join-token-file", str(path))) == "from-file"
    assert cli.TOKEN_ENV not in os.environ
    monkeypatch.setattr("sys.stdin", io.StringIO("from-stdin\n"))
    assert cli.join_token(args_for("--join-token", "-")) == "from-stdin"


def test_an_empty_or_missing_token_file_is_a_clear_error(tmp_path):
    (tmp_path / "empty").write_text("\n")
    for path in (tmp_path / "empty", tmp_path / "missing"):
        with pytest.raises(cli.Fatal, match="--join-token-file"):
            cli.join_token(args_for("--join-token-file", str(path)))


def test_a_literal_token_is_moved_into_a_pipe_and_the_agent_reexecutes_without_it(monkeypatch):
    calls = []
    monkeypatch.setattr(os, "execv", lambda exe, argv: calls.append(argv))
    cli.reexec_without_literal_token(["--server", "http://x", "--join-token", "s3cret", "--name", "n"])
    (argv,) = calls
    assert "s3cret" not in " ".join(argv)
    assert argv[1:3] == ["-m", "agent"] and argv[3:7] == ["--server", "http://x", "--name", "n"]
    fd = int(argv[argv.index("--join-token-fd") + 1])
    assert cli.join_token(args_for("--join-token-fd", str(fd))) == "s3cret"


def test_no_reexec_without_a_literal_token(monkeypatch):
    monkeypatch.setattr(os, "execv", lambda *a: pytest.fail("re-executed"))
    cli.reexec_without_literal_token(["--server", "http://x", "--join-token", "-"])
    cli.reexec_without_literal_token(["--server", "http://x", "--join-token-file", "/t"])


def test_without_any_token_or_stored_credential_the_agent_says_how_to_give_one(tmp_path):
    from agent.client import AgentClient
    from agent.inventory import simulated_inventory
    from agent.spec import parse_spec

    inventory = simulated_inventory("n", parse_spec("1xT4"))
    with pytest.raises(cli.Fatal, match="no join token: set \\$TESSERA_JOIN_TOKEN"):
        cli.register(AgentClient("http://127.0.0.1:9"), inventory, "", None, tmp_path, 1)
