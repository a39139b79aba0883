"""`eaglekit explain`: the meaning of a rule code or pitfall id seen in any output."""

from __future__ import annotations

import click

from eaglekit.cli.output import emit_json, format_option, key_value_table, out

EXAMPLES = """
\b
Examples:
  eaglekit explain EK307
  eaglekit explain P16 --format json
"""


@click.command("explain", epilog=EXAMPLES)
@click.argument("code")
@format_option
def explain_command(code, output_format):
    """Say what a rule code (EK…) or a pitfall id (P…) means, what guards or causes it, and how to fix it."""
    from eaglekit.explain import explain

    doc = explain(code).to_dict()
    if output_format == "json":
        emit_json(doc)
        return
    rows = [("what", doc["title"])] + [(k.replace("_", " "), v) for k, v in doc["facts"].items() if v is not None]
    out.print(key_value_table(rows, title=f"{doc['code']} ({doc['kind']})"))
    if doc["fix"]:
        out.print(f"fix: {doc['fix']}", soft_wrap=True)  # may hold a command to copy: never wrapped
    for item in doc["related"]:
        if doc["kind"] == "rule":
            out.print(f"\n{item['code']}: {item['title']}")
            for key in ("shows_up", "detect"):
                if item.get(key):
                    out.print(f"  {key.replace('_', ' ')}: {item[key]}")
        else:
            out.print(f"guarded by {item['code']} ({item['severity']}, {item['group']}"
                      f"{', ' + item['engine'] if item['engine'] else ''}): {item['title']}")
            out.print(f"  fix: {item['fix']}", soft_wrap=True)
