"""Documentation promises that must stay true: the rule table, the two set-up commands, the recipes' commands."""

import os

from eaglekit.rules import all_rules
from tests.support import REPO

ROOT = str(REPO)
README = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
RULES = open(os.path.join(ROOT, "docs", "rules.md"), encoding="utf-8").read()


def test_every_rule_is_listed_with_its_title_and_severity():
    for rule in all_rules():
        assert f"| {rule.code} | {rule.severity} |" in RULES, rule.code
        assert rule.title in RULES, rule.code


def test_ci_runs_the_readme_test_command_verbatim():
    ci = open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read()
    command = ci.strip().splitlines()[-1]
    assert command.endswith("&& scripts/test-tiers.sh")
    assert f"```bash\n{command}\n```" in README


def test_the_demo_command_names_the_bundled_example():
    assert "bash examples/demo.sh" in README
    demo = open(os.path.join(ROOT, "examples", "demo.sh"), encoding="utf-8").read()
    draft = next(line.split("=", 1)[1] for line in demo.splitlines() if line.startswith("DRAFT="))
    assert os.path.exists(os.path.join(ROOT, draft, "config.json"))


def _readme_commands() -> list[list[str]]:
    blocks = README.split("```bash\n")[1:]
    return [line.split("#")[0].split() for block in blocks for line in block.split("```")[0].splitlines()
            if line.startswith("eaglekit ")]


def _demo_commands() -> list[list[str]]:
    demo = open(os.path.join(ROOT, "examples", "demo.sh"), encoding="utf-8").read().replace("\\\n", " ")
    return [line.split()[1:] for line in demo.splitlines() if line.startswith("step eaglekit ")]


def test_the_recipes_and_the_demo_use_only_options_the_commands_have():
    """Every `eaglekit ...` line in the README and the demo parses: each option it passes exists on that command."""
    import click

    from eaglekit.cli.main import COMMANDS, cli

    readme, demo = _readme_commands(), _demo_commands()
    assert len(readme) >= 10 and {"finetune", "compare", "verify", "upgrade"} <= {words[1] for words in demo}
    for words in readme + demo:
        name = words[1]
        assert name in COMMANDS, words
        command = cli.get_command(click.Context(cli), name)
        known = {opt for param in command.params for opt in [*param.opts, *getattr(param, "secondary_opts", [])]}
        for word in words[2:]:
            if word.startswith("--"):
                assert word.split("=")[0] in known, (name, word)


def test_docs_links_resolve():
    for doc in ("cli.md", "rules.md", "benchmarks.md", "python-api.md", "architecture.md"):
        assert f"](docs/{doc})" in README and os.path.exists(os.path.join(ROOT, "docs", doc))
