"""Entry point: a Click group whose commands are imported only when invoked (keeps --help torch-free)."""

from __future__ import annotations

import importlib
import os
import signal
import sys
import warnings

import click

from eaglekit import __version__

# name -> (module, attribute, one-line help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "inspect": ("eaglekit.cli.inspect", "inspect_command", "Show exactly what a draft checkpoint is (headers only)."),
    "validate": ("eaglekit.cli.validate", "validate_command", "Find every silent killer in a draft before it ships."),
    "upgrade": ("eaglekit.cli.upgrade", "upgrade_command", "Write a correct, vLLM-ready EAGLE-3.1 (or 3) checkpoint."),
    "verify": ("eaglekit.cli.verify", "verify_command", "Run a real speculative decode against the target."),
    "compare": ("eaglekit.cli.compare", "compare_command",
                "Two drafts on the same prompts and target pass: τ difference per category, with intervals."),
    "capture": ("eaglekit.cli.capture", "capture_command",
                "Capture the target's hidden states into a resumable, sharded store (for finetune and upgrade)."),
    "finetune": ("eaglekit.cli.finetune", "finetune_command",
                 "Train a draft against its target (training-time test), e.g. after upgrade."),
    "bench": ("eaglekit.cli.bench", "bench_command",
              "Serving throughput with and without the draft at each concurrency, in vLLM itself."),
    "push": ("eaglekit.cli.push", "push_command", "Publish vLLM-ready artifacts and a model card to the Hub."),
    "explain": ("eaglekit.cli.explain", "explain_command", "Say what a rule code (EK...) or pitfall id (P...) means."),
    "doctor": ("eaglekit.cli.doctor", "doctor_command",
               "Which engines, extras and builds are present, and the command that adds each missing one."),
}


def exit_status(exc: Exception) -> int:
    """The exit status of a library failure: usage errors 2, an interrupted training 130, everything else 1."""
    from eaglekit.errors import CaptureInterrupted, TrainingInterrupted, UsageError

    if isinstance(exc, UsageError):
        return 2
    return _interrupted_status() if isinstance(exc, (TrainingInterrupted, CaptureInterrupted)) else 1




class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module, attr, _ = COMMANDS[name]
        return getattr(importlib.import_module(module), attr)

    def resolve_command(self, ctx: click.Context, args: list[str]):
        """A mistyped command names the closest real one."""
        name = args[0] if args else ""
        if name and name not in COMMANDS and not name.startswith("-"):
            import difflib

            close = difflib.get_close_matches(name, list(COMMANDS), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else f" Commands: {', '.join(COMMANDS)}."
            ctx.fail(f"No such command {name!r}.{hint}")
        return super().resolve_command(ctx, args)

    def invoke(self, ctx: click.Context):
        """Ctrl-C and SIGTERM reach the command's own cleanup as KeyboardInterrupt; here they become the
        interrupted exit (130, or 143 for SIGTERM) before Click turns them into a bare "Aborted."."""
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            raise Interrupted() from None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, help_text) for name, (_, _, help_text) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


class Interrupted(Exception):
    """A command stopped by SIGINT or SIGTERM whose cleanup raised nothing more specific."""


_TERMINATED = False


def _on_sigterm(signum, frame) -> None:
    """SIGTERM (what `timeout`, schedulers and `kill` send) unwinds exactly like Ctrl-C: staged outputs are removed,
    training saves its checkpoint."""
    global _TERMINATED
    _TERMINATED = True
    raise KeyboardInterrupt


def _interrupted_status() -> int:
    return 128 + (signal.SIGTERM if _TERMINATED else signal.SIGINT)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="eaglekit")
def cli() -> None:
    """eaglekit: inspect, validate, upgrade, verify and publish EAGLE-3 / EAGLE-3.1 draft models."""


def _secrets(argv: list[str]) -> list[str]:
    """Token values this run knows: the environment's, the saved login's and --token's on the command line."""
    from eaglekit.redact import MIN_SECRET_CHARS, known_secrets

    found = set(known_secrets())
    for i, arg in enumerate(argv):
        if arg == "--token" and i + 1 < len(argv):
            found.add(argv[i + 1])
        elif arg.startswith("--token="):
            found.add(arg.split("=", 1)[1])
    return sorted((t for t in found if len(t) >= MIN_SECRET_CHARS), key=len, reverse=True)


MAX_LINE_CHARS = 400
"""An error line's bound: its start (the file) and its end (the problem) are kept, the middle is cut."""


def one_line(message: str, argv: list[str]) -> str:
    """A message as one bounded, printable line: secrets and URL credentials redacted, control characters
    escaped, and anything past MAX_LINE_CHARS cut from the middle."""
    from eaglekit.redact import printable, without_secrets

    line = printable(without_secrets(message, _secrets(argv)))
    if len(line) <= MAX_LINE_CHARS:
        return line
    head = MAX_LINE_CHARS * 3 // 4
    return f"{line[:head]} … {line[head + 3 - MAX_LINE_CHARS:]}"


def paths_as_typed(message: str, argv: list[str]) -> str:
    """A library error names the files it read as resolved (absolute, links followed): written back as the command
    line typed them, so the line reads in the user's own terms, as the reports do (with_given)."""
    from eaglekit.cli.output import with_given

    typed = [value for arg in argv for value in (arg, arg.partition("=")[2]) if value and not value.startswith("-")]
    given: dict[str, str] = {}
    for path in typed:
        if os.path.lexists(path):
            given.update({form: path for form in (os.path.abspath(path), os.path.realpath(path)) if form != path})
    return with_given(message, given)


def _safe_streams() -> None:
    """Unencodable characters (lone surrogates from hostile names) print escaped instead of raising."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")


def _wants_json(args: list[str]) -> bool:
    return "--format=json" in args or any(a == "--format" and b == "json" for a, b in zip(args, args[1:]))


def _emit_error(line: str, exit_code: int, kind: str) -> None:
    """Under --format json a failure is also a JSON document on stdout (schemas/error.schema.json)."""
    import json

    message = line[len("Error: "):] if line.startswith("Error: ") else line
    click.echo(json.dumps({"error": {"type": kind, "message": message, "exit_code": exit_code}}))


def _fail(line: str, exit_code: int, kind: str, args: list[str]) -> None:
    if _wants_json(args):
        _emit_error(line, exit_code, kind)
    click.echo(line, err=True)
    sys.exit(exit_code)


def main(argv: list[str] | None = None) -> None:
    """Run the CLI: expected failures become one line on stderr (exit 1, usage 2); EAGLEKIT_DEBUG=1 re-raises.

    Anything unexpected is one line too (an internal error, exit 1), so no input can end in a traceback."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = os.environ.get("EAGLEKIT_DEBUG") == "1"
    _safe_streams()
    if not debug:  # library warnings (torch, numpy, transformers) are not eaglekit's findings: they would add lines
        warnings.simplefilter("ignore")
    global _TERMINATED
    _TERMINATED = False
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        _run(args, debug)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(args: list[str], debug: bool) -> None:
    from eaglekit.errors import EaglekitError

    try:
        rv = cli.main(args=args, prog_name="eaglekit", standalone_mode=False)
    except EaglekitError as exc:
        if debug:
            raise
        _fail(one_line(f"Error: {paths_as_typed(str(exc), args)}", args), exit_status(exc), type(exc).__name__,
              args)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(1)
    except click.ClickException as exc:
        if _wants_json(args):
            _emit_error(one_line(f"Error: {exc.format_message()}", args), exc.exit_code, "UsageError")
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except (KeyboardInterrupt, Interrupted):
        if debug:
            raise
        signal_name = "SIGTERM" if _TERMINATED else "Ctrl-C"
        _fail(f"Error: interrupted ({signal_name}); no output was left behind", _interrupted_status(), "Interrupted",
              args)
    except ModuleNotFoundError as exc:
        from eaglekit.doctor import optional_modules

        module = (exc.name or "").split(".")[0]
        extra = optional_modules().get(module)
        if extra is None or debug:
            raise
        _fail(f"Error: this command needs {module}, which is not installed: pip install 'eaglekit[{extra}]'", 1,
              "MissingDependency", args)
    except Exception as exc:  # a bug or an input nothing anticipated: still one line
        if debug:
            raise
        detail = str(exc).splitlines()[0][:300] if str(exc) else ""
        _fail(one_line(f"Error: internal error ({type(exc).__name__}: {detail}); "
                       "rerun with EAGLEKIT_DEBUG=1 for the traceback", args), 1, "InternalError", args)
    if isinstance(rv, int) and rv:  # non-standalone Click returns ctx.exit(n)'s code instead of raising
        sys.exit(rv)
