"""Secret values kept out of what a run writes (alpineagents.redaction), and the model
client's key kept out of the errors it raises."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import anthropic
import pytest

from alpineagents import Agent, FileStore, Message, State
from alpineagents.redaction import Redactor
from alpineagents.testing import ModelServer, error

KEY = "sk-ant-api03-" + "k" * 40


def test_a_redactor_masks_each_secret_in_text_data_and_streams() -> None:
    redactor = Redactor(["s3cr3t-value-1", "s3cr3t-value-1-longer", "short"])
    assert redactor.text("a s3cr3t-value-1-longer b s3cr3t-value-1") == "a *** b ***"
    assert redactor.text("short stays") == "short stays"  # too short to mask safely
    data = {"k": ["s3cr3t-value-1", {"s3cr3t-value-1": 3}], "n": 1}
    assert redactor.data(data) == {"k": ["***", {"***": 3}], "n": 1}
    target = io.StringIO()
    stream = redactor.stream(target)
    stream.write("token s3cr3t-")  # a secret written in two pieces is still masked
    stream.write("value-1 end\nrest")
    assert target.getvalue() == "token *** end\n"
    stream.flush()
    assert target.getvalue() == "token *** end\nrest"
    assert not Redactor([]) and Redactor(["12345678"])


def test_the_secrets_of_an_environment(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("session-token-from-a-file\n")
    env = {
        "ANTHROPIC_API_KEY": KEY,
        "AWS_SESSION_TOKEN_FILE": str(token_file),
        "TEAM_TOKEN": "team-token-value",
        "PLAIN": "team-plain-value",
        "LISTED": "listed-by-the-operator",
        "ALPINEAGENTS_SECRET_ENV": "LISTED",
        "ALPINEAGENTS_ENCRYPTION_KEYS": "k1:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
        "HOME": "/home/someone-long",
    }
    redactor = Redactor.from_environment(env)
    text = " ".join(env.values()) + " session-token-from-a-file"
    masked = redactor.text(text)
    for secret in (KEY, "team-token-value", "listed-by-the-operator", "session-token-from-a-file"):
        assert secret not in masked
    assert "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=" not in masked
    assert "team-plain-value" in masked and "/home/someone-long" in masked


def test_the_guarded_stdio_masks_prints_and_tracebacks(capfd: pytest.CaptureFixture[str]) -> None:
    with Redactor(["hunter2-hunter2"]).guarding_stdio():
        print("password is hunter2-hunter2")
        print("on stderr hunter2-hunter2", file=sys.stderr)
    out, err = capfd.readouterr()
    assert out == "password is ***\n" and err == "on stderr ***\n"


def test_a_model_error_that_echoes_the_key_is_saved_without_it(
    tmp_path: Path, model_server: ModelServer
) -> None:
    model_server.add(error(401, f"invalid x-api-key: {KEY}"))
    client = anthropic.Anthropic(base_url=model_server.url, api_key=KEY, max_retries=0)
    agent = Agent(model="claude-sonnet-5", store=FileStore(tmp_path), client=client)
    state = State("run", messages=[Message.user("hi")])
    with pytest.raises(anthropic.AuthenticationError) as raised:
        agent.run(state)
    assert KEY not in str(raised.value) and "invalid x-api-key: ***" in str(raised.value)
    assert KEY not in str(raised.value.body)
    saved = "".join(p.read_text() for p in tmp_path.rglob("*") if p.is_file())
    assert "invalid x-api-key: ***" in saved and KEY not in saved


def test_each_form_of_a_secret_is_masked() -> None:
    redactor = Redactor(
        [
            "value-with-newline\n",
            "first-line-of-it\nsecond-line-of-it\nab\n",
            "Bearer tok-tok-tok-1",
        ]
    )
    text = "value-with-newline.\nsecond-line-of-it first-line-of-it ab Bearer tok-tok-tok-1 tok-tok-tok-1"
    assert redactor.text(text) == "***.\n*** *** ab *** ***"  # "ab" is too short to mask
    # The newline after a value stays: only the value is masked.
    assert redactor.text("x value-with-newline\ny") == "x ***\ny"


def test_a_value_learnt_later_is_masked_from_then_on(tmp_path: Path) -> None:
    from alpineagents.redaction import learn

    token_file = tmp_path / "token"
    token_file.write_text("session-token-first\n")
    redactor = Redactor.from_environment({"AWS_SESSION_TOKEN_FILE": str(token_file)})
    plain = Redactor(["unrelated-secret"])
    assert redactor.text("session-token-first") == "***"
    token_file.write_text("session-token-second\n")  # renewed in place
    assert redactor.text("session-token-second") == "***"
    learn("renewed-access-key")  # what a credentials reader tells every run's Redactor
    assert redactor.text("renewed-access-key") == "***"
    assert Redactor.from_environment({}).text("renewed-access-key") == "***"
    assert plain.text("renewed-access-key") == "renewed-access-key"  # not from_environment
    plain.add("added-by-hand")
    assert plain.text("added-by-hand") == "***"
