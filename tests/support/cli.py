"""Drive the CLI exactly as the console script does, so tests see its one-line errors and exit codes."""

import signal

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


def ctrl_c_reaches_it() -> None:
    """`preexec_fn` for a process a test interrupts with SIGINT. A shell starts a background job with SIGINT
    ignored, so a suite run from one (and every process it starts: an ignored signal stays ignored across exec)
    would never see the test's Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
