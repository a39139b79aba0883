"""README promises that must stay true: the rule table and the two set-up commands."""

import os

from eaglekit.rules import all_rules

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()


def test_every_rule_is_listed_with_its_title_and_severity():
    for rule in all_rules():
        assert f"| {rule.code} | {rule.severity} |" in README, rule.code
        assert rule.title in README, rule.code


def test_ci_runs_the_readme_test_command_verbatim():
    ci = open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read()
    command = ci.strip().splitlines()[-1]
    assert command.endswith("python -m pytest -q")
    assert f"```bash\n{command}\n```" in README


def test_the_demo_command_names_the_bundled_example():
    assert "bash examples/demo.sh" in README
    demo = open(os.path.join(ROOT, "examples", "demo.sh"), encoding="utf-8").read()
    draft = next(line.split("=", 1)[1] for line in demo.splitlines() if line.startswith("DRAFT="))
    assert os.path.exists(os.path.join(ROOT, draft, "config.json"))
