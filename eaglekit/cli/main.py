"""Entry point: a Click group whose commands are imported only when invoked (keeps --help torch-free)."""

from __future__ import annotations

import importlib
import os
import sys

import click

from eaglekit import __version__

# name -> (module, attribute, one-line help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "inspect": ("eaglekit.cli.inspect", "inspect_command", "Show exactly what a draft checkpoint is (headers only)."),
    "validate": ("eaglekit.cli.validate", "validate_command", "Find every silent killer in a draft before it ships."),
    "upgrade": ("eaglekit.cli.upgrade", "upgrade_command", "Write a correct, vLLM-ready EAGLE-3.1 (or 3) checkpoint."),
    "verify": ("eaglekit.cli.verify", "verify_command", "Run a real speculative decode against the target."),
    "finetune": ("eaglekit.cli.finetune", "finetune_command",
                 "Train a draft against its target (training-time test), e.g. after upgrade."),
    "push": ("eaglekit.cli.push", "push_command", "Publish vLLM-ready artifacts and a model card to the Hub."),
}


OPTIONAL_MODULES = {"torch": "torch", "transformers": "torch", "accelerate": "torch", "gguf": "torch",
                    "triton": "triton", "matplotlib": "plot"}
"""Import name -> the eaglekit extra that installs it."""


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module, attr, _ = COMMANDS[name]
        return getattr(importlib.import_module(module), attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, help_text) for name, (_, _, help_text) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="eaglekit")
def cli() -> None:
    """eaglekit: inspect, validate, upgrade, verify and publish EAGLE-3 / EAGLE-3.1 draft models."""


def main(argv: list[str] | None = None) -> None:
    """Run the CLI: expected failures become one line on stderr (exit 1, usage 2); EAGLEKIT_DEBUG=1 re-raises."""
    from eaglekit.errors import EaglekitError

    try:
        rv = cli.main(args=argv, prog_name="eaglekit", standalone_mode=False)
    except EaglekitError as exc:
        if os.environ.get("EAGLEKIT_DEBUG") == "1":
            raise
        click.echo(f"Error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(1)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("Interrupted.", err=True)
        sys.exit(130)
    except ModuleNotFoundError as exc:
        module = (exc.name or "").split(".")[0]
        if module not in OPTIONAL_MODULES or os.environ.get("EAGLEKIT_DEBUG") == "1":
            raise
        click.echo(f"Error: this command needs {module}, which is not installed: "
                   f"pip install 'eaglekit[{OPTIONAL_MODULES[module]}]'", err=True)
        sys.exit(1)
    if isinstance(rv, int) and rv:  # non-standalone Click returns ctx.exit(n)'s code instead of raising
        sys.exit(rv)
