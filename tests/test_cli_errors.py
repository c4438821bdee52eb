"""Every way `webslm` can be called wrongly ends in one line on stderr and a nonzero exit:
bad arguments, settings out of range, text that is not Unicode, prompts longer than the
context, chat templates that fail or run away, files that are not models. Never a traceback.

The cases run in-process through cli.main (fast); two go through a real process, where
invalid UTF-8 on the command line reaches Python as surrogate escapes."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

import slm_surgery as surgery
from webslm import cli


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    try:
        status = cli.main([str(a) for a in argv])
    except SystemExit as exit_:                  # argparse exits
        status = exit_.code
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture(scope="module")
def models(fixture_slm, tmp_path_factory):
    where = tmp_path_factory.mktemp("cli")
    (where / "fixture.slm").write_bytes(fixture_slm)
    for name, template in {"broken": "{% for %}", "hostile": "{{ '%(a)999999999s' % {'a': 1} }}",
                           "slow": "{% set s = 'a' * 3999999 %}{% for i in range(100000) %}{{ s.count('b') and '' }}"
                                   "{% endfor %}"}.items():
        pieces = surgery.split(fixture_slm)
        pieces.manifest["chat_template"]["template"] = template
        (where / f"{name}.slm").write_bytes(surgery.join(pieces))
    (where / "junk.slm").write_bytes(bytes(range(256)) * 16)
    (where / "truncated.slm").write_bytes(fixture_slm[:5000])
    return where


CASES = {
    "max-tokens 0": (["--max-tokens", "0"], "max_tokens"),
    "max-tokens -1": (["--max-tokens", "-1"], "max_tokens"),
    "temperature -1": (["--temperature", "-1"], "temperature"),
    "temperature nan": (["--temperature", "nan"], "temperature"),
    "temperature inf": (["--temperature", "inf"], "temperature"),
    "seed -1": (["--seed", "-1"], "seed"),
    "seed 2**64": (["--seed", str(2**64)], "seed"),
    "seed abc": (["--seed", "abc"], "--seed"),
    "empty stop": (["--stop", ""], "stop"),
    "greedy and seed": (["--greedy", "--seed", "1"], "not allowed with"),
    "bad backend": (["--backend", "cuda"], "--backend"),
    "a lone surrogate in the system message": (["--chat", "--system", "\udcc3"], "bad-prompt"),
}


@pytest.mark.parametrize("name", CASES)
def test_a_bad_generate_argument_is_one_line_and_exit_2(capsys, models, name):
    extra, mention = CASES[name]
    status, _, err = run_cli(capsys, "generate", "--model", models / "fixture.slm", "--prompt", "Hi", *extra)
    assert status == 2, err
    assert len(err.strip().splitlines()) == 1 and mention in err and "Traceback" not in err, err


@pytest.mark.parametrize("model, prompt, code", [
    ("fixture", "word " * 20000, "prompt-too-long"),
    ("broken", "Hi", "bad-template"),
    ("hostile", "Hi", "bad-template"),
    ("slow", "Hi", "bad-template"),
])
def test_a_prompt_the_model_cannot_take_is_refused_in_one_line(capsys, models, model, prompt, code):
    status, out, err = run_cli(capsys, "generate", "--model", models / f"{model}.slm", "--prompt", prompt, "--chat")
    assert status == 2 and out == ""
    assert err.startswith(f"webslm generate: {code} at ") and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("command, target, status", [
    ("generate", "missing.slm", 2), ("generate", ".", 2), ("generate", "junk.slm", 1),
    ("validate", ".", 2), ("inspect", "truncated.slm", 1), ("validate", "junk.slm", 1),
])
def test_a_file_that_is_not_a_model_is_one_line(capsys, models, command, target, status):
    path = models / target
    argv = ["generate", "--model", path, "--prompt", "Hi"] if command == "generate" else [command, path]
    got, _, err = run_cli(capsys, *argv)
    assert got == status and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def test_an_unexpected_error_is_still_one_line(capsys, models, monkeypatch):
    def bug(args):
        raise KeyError("a bug")
    monkeypatch.setattr(cli, "cmd_validate", bug)
    monkeypatch.delenv("WEBSLM_TRACEBACK", raising=False)
    # main builds its parser on each call: it takes the patched command
    status, _, err = run_cli(capsys, "validate", models / "fixture.slm")
    assert status == 3 and "unexpected KeyError" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("prompt", [b"\xff\xfe", b"caf\xc3"])
def test_invalid_utf8_on_a_real_command_line(models, prompt):
    done = subprocess.run([sys.executable.encode(), b"-m", b"webslm.cli", b"generate", b"--model",
                           os.fsencode(models / "fixture.slm"), b"--prompt", prompt], capture_output=True)
    err = done.stderr.decode("utf-8", "replace")
    assert done.returncode == 2 and "bad-prompt" in err and len(err.strip().splitlines()) == 1, err
