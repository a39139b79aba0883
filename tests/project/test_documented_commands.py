"""Every `eaglekit …` command the README and the docs print in a shell block parses as written: the command
exists, every option is one it takes, every value converts, no argument is missing. The files and the model they
name are not needed (path checks and the resolution of --target are the conversions left out), so a renamed flag or
a dropped option fails here, not in a user's terminal."""

from __future__ import annotations

import re
import shlex

import click
import pytest

from eaglekit import target
from eaglekit.cli.main import cli
from tests.support import REPO

DOCUMENTS = ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))]
SHELL_BLOCK = re.compile(r"```(?:bash|sh|console|shell)\n(.*?)```", re.S)


def documented_commands() -> list[tuple[str, str]]:
    """(document, command line) for each `eaglekit` line of a shell block, continuations joined, comments cut."""
    found = []
    for name in DOCUMENTS:
        for block in SHELL_BLOCK.findall((REPO / name).read_text(encoding="utf-8")):
            for line in re.sub(r"\\\n\s*", " ", block).splitlines():
                line = line.strip().removeprefix("$ ")
                if line.startswith("eaglekit "):
                    found.append((name, line))
    return found


def test_the_documents_hold_commands_to_check():
    names = {shlex.split(line, comments=True)[1] for _, line in documented_commands()}
    assert {"inspect", "validate", "upgrade", "verify", "bench", "push", "finetune", "compare"} <= names


@pytest.mark.parametrize("document, line", documented_commands())
def test_a_documented_command_parses_as_written(document, line, monkeypatch):
    monkeypatch.setattr(click.Path, "convert", lambda self, value, param, ctx: value)
    monkeypatch.setattr(target, "resolve_target", lambda value: value)  # --target names the example's model
    words = shlex.split(line, comments=True)
    for command in " ".join(words[1:]).split(" && eaglekit "):  # one line may chain several
        args = shlex.split(command)
        with cli.make_context("eaglekit", list(args)) as group:
            name, sub, rest = cli.resolve_command(group, list(args))
            assert sub is not None, f"{document}: {line}"
            try:
                sub.make_context(name, rest, parent=group)
            except click.UsageError as exc:
                pytest.fail(f"{document}: `{line}` does not parse: {exc.format_message()}")
