"""`eaglekit validate`: run the rule engine over a draft and fail on what would break it in serving."""

from __future__ import annotations

import click
from rich.table import Table

from eaglekit.cli.output import (
    SEVERITY_STYLE,
    emit_json,
    format_option,
    given_paths,
    out,
    print_findings,
    print_fix,
    print_prose,
    styled,
    target_path,
    with_given,
)
from eaglekit.engines import RECORDS

EXAMPLES = """
\b
Examples:
  eaglekit validate ./my-draft
  eaglekit validate ./my-draft --target ./Llama-3.1-8B-Instruct --deep
  eaglekit validate ./my-draft --engine vllm --engine-version 0.22 --strict --format json
  eaglekit validate ./my-draft --target ./Llama-3.1-8B-Instruct --engine vllm,sglang,tokenspeed
  eaglekit validate --list-rules
"""

_ORDER = {"error": 0, "warning": 1, "info": 2}


@click.command("validate", epilog=EXAMPLES)
@click.argument("path", required=False)
@click.option("--target", callback=target_path,
              help="Target model dir, its config.json, or a Hub id (through the Hugging Face cache): L, T, V, "
                   "tie_word_embeddings, architecture.")
@click.option("--engine", default="vllm", show_default=True, metavar="NAME[,NAME...]|all",
              help=f"Serving engine(s) whose rules run: {', '.join(RECORDS)}, a comma list "
                   "(also says where they read one config differently) or all.")
@click.option("--engine-version", metavar="X.Y", help="Engine version to check against (default: latest known).")
@click.option("--deep", is_flag=True, help="Also read every tensor once: NaN/Inf, zero or constant weights, d2t/t2d.")
@click.option("--strict", is_flag=True, help="Warnings fail too.")
@click.option("--list-rules", is_flag=True, help="Print every rule (code, severity, group, pitfall) and exit.")
@click.option("--subfolder", help="Draft folder inside a repository that holds several drafts.")
@click.option("--revision", help="Hub revision when PATH is a repo id.")
@click.option("--family", help="Skip detection and read the checkpoint as this layout.")
@click.option("--allow-pickle", is_flag=True, help="Load .bin/.pt weights with torch.load(weights_only=True).")
@format_option
@click.pass_context
def validate_command(ctx, path, target, engine, engine_version, deep, strict, list_rules, subfolder, revision, family,
                     allow_pickle, output_format):
    """Check a draft against every known pitfall; exit 1 on errors (or warnings with --strict)."""
    from eaglekit.rules import all_rules, checked_engines

    checked_engines(engine, engine_version)  # a bad --engine is refused before the draft is read
    if list_rules:
        rules = [r.to_dict() for r in all_rules()]
        emit_json({"rules": rules}) if output_format == "json" else render_rules(rules)
        return
    if not path:
        raise click.UsageError("PATH is required (or --list-rules)")

    from eaglekit.errors import NotEagle3DraftError
    from eaglekit.families import load_draft
    from eaglekit.other_drafts import validation_report
    from eaglekit.rules import run_rules
    from eaglekit.target import read_target

    target_info = read_target(target) if target else None
    try:
        spec = load_draft(path, subfolder=subfolder, revision=revision, allow_pickle=allow_pickle, family=family,
                          target=target_info)
    except NotEagle3DraftError as exc:  # recognised, and not an EAGLE-3 draft: it fails, and says what serves it
        other = validation_report(exc.path or path, exc.draft, strict)
        given = given_paths([path], resolved={exc.path: path} if exc.path else None)
        emit_json(other) if output_format == "json" else render_other_method(with_given(other, given))
        ctx.exit(1)
    report = run_rules(spec, target=target_info, engine=engine, engine_version=engine_version, deep=deep)
    doc = report.to_dict(strict=strict)
    if output_format == "json":
        emit_json(doc)
    else:
        render_report(with_given(doc, given_paths([path], [target], resolved={spec.path: path})), spec.family,
                      spec.producer)
    if report.failed(strict):
        ctx.exit(1)


def render_report(doc: dict, family: str, producer: str) -> None:
    from eaglekit.engines import engine_record

    checked = ", ".join(doc["groups"])
    engines = ", ".join(f"{e['engine']} {e['version']}" for e in doc["engines"])
    out.print(styled((doc["path"], "bold"), f"  {family} — {producer}"))
    out.print(f"checked: {checked}" + (f" (engine: {engines})" if engines else ""))
    if doc["target_mismatch"]:
        print_prose("wrong target? ", doc["target_mismatch"], "bold yellow")
    findings = sorted(doc["findings"], key=lambda f: (_ORDER[f["severity"]], f["code"]))
    if findings:
        print_findings(findings)
    counts = f"{doc['errors']} error(s), {doc['warnings']} warning(s), {doc['infos']} info"
    if len(doc["engines"]) > 1 or any(e["settings"] for e in doc["engines"]):
        for e in doc["engines"]:
            record = engine_record(e["engine"])
            served = "serves it after conversion" if record.needs_conversion else "serves it"
            verdict = (served, "green") if e["ok"] else (f"{e['errors']} error(s) stop it", "bold red")
            needs = f" with {'; '.join(e['settings'])}" if e["ok"] and e["settings"] else ""
            out.print(styled(f"{e['engine']} {e['version']}: ", verdict, needs), soft_wrap=True)
            if len(doc["engines"]) > 1 and e["fix"]:
                print_fix("  fix: ", e["fix"])
            elif len(doc["engines"]) > 1 and e["ok"] and record.needs_conversion:
                print_prose("  ", record.conversion_hint(), indent="    ")
    for note in doc["conflicts"]:
        out.print(styled(("conflict: ", "bold yellow"), note))
    if doc["fix"] and len(doc["engines"]) == 1:
        record = engine_record(doc["engines"][0]["engine"])
        out.print(f"convert ({record.label} loads GGUF only; the source is never changed):" if record.needs_conversion
                  else "fix (rewrites what the engine rules check, validates its output, never changes the source):")
        print_fix("  ", doc["fix"])
    elif len(doc["engines"]) == 1 and engine_record(doc["engines"][0]["engine"]).needs_conversion and doc["ok"]:
        print_prose("", engine_record(doc["engines"][0]["engine"]).conversion_hint())
    if doc["ok"]:
        out.print(styled(("PASSED", "green"), f": {counts}"))
    else:
        why = " (--strict: warnings fail)" if doc["strict"] and not doc["errors"] else ""
        out.print(styled(("FAILED", "bold red"), f": {counts}{why}"))


def render_other_method(doc: dict) -> None:
    method = doc["speculative_method"]
    out.print(styled((doc["path"], "bold"), f"  {method['family']} — {method['producer']}"))
    if method["vllm"]["problem"]:
        print_prose("vLLM: ", method["vllm"]["problem"], "bold yellow")
    print_prose("FAILED:", f"{method['summary']} (`eaglekit inspect` shows what it reads)", "bold red")


def render_rules(rules: list[dict]) -> None:
    table = Table(title=f"{len(rules)} rules", title_justify="left")
    for col in ("code", "severity", "group", "engine", "pitfall", "title"):
        table.add_column(col, no_wrap=col != "title")
    for r in rules:
        sev = r["severity"]
        table.add_row(r["code"], styled((sev, SEVERITY_STYLE[sev])), r["group"], r["engine"] or "", r["pitfall"] or "",
                      r["title"])
    out.print(table)
