"""`eaglekit doctor`: which engines, extras and builds are present, and how to add each missing one."""

from __future__ import annotations

import sys

import click

from eaglekit.cli.output import emit_json, format_option, out, print_fix, print_prose_table, printable_doc

EXAMPLES = """
\b
Examples:
  eaglekit doctor
  eaglekit doctor --format json
"""

STATUS_STYLE = {"ok": "green", "missing": "yellow", "broken": "bold red"}


@click.command("doctor", epilog=EXAMPLES)
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=1), default=60.0, show_default=True,
              help="Seconds each child interpreter (torch, vLLM) may take to answer.")
@format_option
def doctor_command(timeout_s, output_format):
    """Report Python, eaglekit, torch, the vLLM environment, the llama.cpp build, optional extras and the example
    target, each with the command that adds it. Exit 0 when eaglekit itself can run, 1 when it cannot."""
    from eaglekit.doctor import diagnose

    diagnosis = diagnose(timeout_s)
    doc = diagnosis.to_dict()
    if output_format == "json":
        emit_json(doc)
    else:
        render(doc)
    if not diagnosis.usable:
        sys.exit(1)


def render(doc: dict) -> None:
    fixes = [(c["name"], c["fix"]) for c in doc["checks"] if c["fix"]]  # print_fix quotes each word it prints
    doc = printable_doc(doc)  # versions, paths and messages probed from this machine's installs
    rows = [(c["name"], c["status"], c["detail"]) for c in doc["checks"]]
    print_prose_table(f"eaglekit doctor ({doc['eaglekit_version']})", ("name", "status", "detail"), rows,
                      {1: STATUS_STYLE.get})
    for name, fix in fixes:
        print_fix(f"{name}: fix: ", fix, style="")
    out.print("eaglekit can run" if doc["usable"] else "eaglekit cannot run: fix the core rows above")
