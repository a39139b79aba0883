"""Drive the CLI exactly as the console script does, so tests see its one-line errors and exit codes."""

import click
from click.testing import CliRunner, Result

from eaglekit.cli.main import main


@click.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []})
@click.pass_context
def _console_script(ctx):
    main(list(ctx.args))


def run_cli(args: list[str]) -> Result:
    """`eaglekit ARGS...` in-process; `result.stdout` / `result.stderr` / `result.exit_code`."""
    return CliRunner().invoke(_console_script, list(args), catch_exceptions=False)
