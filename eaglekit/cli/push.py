"""`eaglekit push`: publish a validated draft with its model card in one Hub commit."""

from __future__ import annotations

import click
from rich.table import Table

from eaglekit.cli.output import (
    emit_json,
    err,
    format_option,
    human_bytes,
    out,
    print_findings,
    printable_doc,
    styled,
    write_text_atomically,
)

EXAMPLES = """
\b
Examples:
  eaglekit push ./out --repo-id my-org/Llama-3.1-8B-EAGLE3.1 --target meta-llama/Llama-3.1-8B-Instruct --dry-run
  eaglekit push ./out --repo-id my-org/Llama-3.1-8B-EAGLE3.1 --target meta-llama/Llama-3.1-8B-Instruct \
      --report verify.json --bench bench.json
  eaglekit push ./out --repo-id my-org/draft --revision v2 --create-pr --format json
"""


def _repo_id(ctx: click.Context, param: click.Parameter, value: str) -> str:
    from eaglekit.errors import UsageError
    from eaglekit.hub.upload import check_repo_id

    try:
        check_repo_id(value)
    except UsageError as exc:
        raise click.BadParameter(str(exc)) from None
    return value


@click.command("push", epilog=EXAMPLES)
@click.argument("draft", type=click.Path(exists=True, file_okay=False))
@click.option("--repo-id", required=True, callback=_repo_id, help="Destination repository, ORG/NAME.")
@click.option("--target", help="Target model: a Hub id (the card's base_model and serve commands name it), or the "
                                "local folder a --report measured (the Hub id its config records names it).")
@click.option("--target-id", help="The Hub id of a local --target folder, for the card's base_model and serve "
                                   "commands (default: the Hub id its config records).")
@click.option("--report", "report_path", type=click.Path(exists=True, dir_okay=False),
              help="Verify report JSON (from eaglekit verify) to put in the card.")
@click.option("--bench", "bench_path", type=click.Path(exists=True, dir_okay=False),
              help="Bench report JSON (from eaglekit bench --save-report): the card's serving-speed section.")
@click.option("--plot", "plots", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="A PNG eaglekit drew (bench, verify, compare or finetune --plot) to upload under eval/ and show "
                   "on the card; repeatable.")
@click.option("--private", is_flag=True, help="Create the repository private (ignored if it exists).")
@click.option("--revision", help="Branch to commit to (created if missing); with --create-pr, the PR's base.")
@click.option("--create-pr", is_flag=True, help="Open a pull request instead of committing to the branch.")
@click.option("--commit-message", help="Commit summary (default names the EAGLE version and eaglekit version).")
@click.option("--token", help="Hugging Face token (default: HF_TOKEN, then the saved login).")
@click.option("--endpoint", help="Hub endpoint URL (default: HF_ENDPOINT or https://huggingface.co).")
@click.option("--dry-run", is_flag=True,
              help="Build the card and the file list and upload nothing; ask the Hub whose the token is, whether it "
                   "can write to the repository's namespace and whether the repository exists. Exits 1, the reason "
                   "last, when a real push would fail or is not known to succeed (no token, a read-only token, an "
                   "unreachable Hub).")
@click.option("--offline", is_flag=True, help="With --dry-run: ask the Hub nothing, and exit 0 (not checked).")
@click.option("--force", is_flag=True, help="Push even if validation finds errors (the card says so).")
@click.option("--allow-few-samples", is_flag=True,
              help="Put --bench figures measured over fewer requests than an interval needs (10) on the card; it "
                   "says so beside each.")
@click.option("--card-out", type=click.Path(dir_okay=False), help="Also write the model card (README.md) here.")
@click.option("--license", "license_id",
              help="The card's licence: a Hub licence id (apache-2.0, mit, llama3.1, ...) or other with "
                   "--license-link.")
@click.option("--license-link", help="With --license other: the URL of the licence text.")
@format_option
def push_command(draft, repo_id, target, target_id, report_path, bench_path, plots, private, revision, create_pr,
                 commit_message, token, endpoint, dry_run, offline, force, allow_few_samples, card_out, license_id,
                 license_link, output_format):
    """Validate DRAFT for vLLM and publish config, weights, model card and eaglekit.json to the Hub."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    from eaglekit.hub.evidence import load_bench_report, load_report
    from eaglekit.hub.push import push
    from eaglekit.io.outputs import Role, read_roles, refuse_clobber, target_roles
    from eaglekit.redact import printable

    refuse_clobber([Role("--card-out", card_out)],
                   [*read_roles("draft", draft), *read_roles("--report", report_path),
                    *read_roles("--bench", bench_path), *(r for plot in plots for r in read_roles("--plot", plot)),
                    *target_roles(local_path(target))])
    report = load_report(report_path) if report_path else None
    bench = load_bench_report(bench_path) if bench_path else None
    bars_were_off = are_progress_bars_disabled()
    if output_format == "json":
        disable_progress_bars()
    try:
        result = push(draft, repo_id, target=target, target_id=target_id, report=report, bench=bench, plots=plots,
                      private=private,
                      revision=revision, create_pr=create_pr, commit_message=commit_message, token=token,
                      endpoint=endpoint, dry_run=dry_run, offline=offline, force=force,
                      allow_few_samples=allow_few_samples, license=license_id, license_link=license_link)
    finally:
        if not bars_were_off:
            enable_progress_bars()
    doc = result.to_dict()
    if card_out:
        write_text_atomically(card_out, doc["card"])
    if output_format == "json":
        emit_json(doc)
    else:
        render(doc)
    check = doc.get("hub_check") or {}
    if check.get("blocker"):  # the preflight a CI job runs: a push that would fail (or is not known to succeed)
        click.echo(f"Error: {repo_id}: {printable(check['blocker'])}", err=True)  # fails here, its reason last
        raise click.exceptions.Exit(1)


def local_path(value: str | None) -> str | None:
    """--target when it names a local folder or file (it may also be a Hub id)."""
    import os

    return value if value and os.path.exists(value) else None


def render(doc: dict) -> None:
    out.print(styled(("README.md (model card):", "bold")))
    click.echo(doc["card"].rstrip("\n"))  # plain Markdown, never wrapped: the serve commands can be copied
    doc = printable_doc(doc)  # the Hub's answers (account, roles), file names and paths come from outside
    out.print()
    files = Table(title="Files" + (" (not sent: dry run)" if doc["dry_run"] else ""), title_justify="left")
    for col in ("path", "size", "sha256"):
        files.add_column(col, no_wrap=True)
    for f in doc["files"]:
        files.add_row(f["path"], human_bytes(f["size"]), f["sha256"][:16] + "…")
    out.print(files)
    if doc["findings"]:
        print_findings(doc["findings"], title="Validation (vLLM)")
    for warning in doc["warnings"]:
        err.print(styled(("warning:", "yellow"), f" {warning}"))
    if doc["forced"]:
        err.print(styled(("Published with --force despite what validation refused; the card says so.", "bold red")))
    if doc["dry_run"]:
        out.print(f"Dry run: nothing uploaded. Would push {len(doc['files'])} files to {doc['url']}")
        _render_hub_check(doc["hub_check"])
    elif doc["pr_url"]:
        out.print(f"Opened {doc['pr_url']}")
    else:
        out.print(f"Pushed {doc['commit_url']}")


def _render_hub_check(check: dict) -> None:
    """What the Hub said before the push, one line each."""
    for note in check["notes"]:
        out.print(f"Hub: {note}", soft_wrap=True)
