"""Rendering shared by every command: rich for people on stdout, diagnostics on stderr, JSON for scripts.

rich is imported when a table or a console is first needed: a command that prints JSON never loads it. The
panels, tables and lines printed through print_panel, print_table and print_text are drawn without rich
(eaglekit.cli.plain) wherever it draws them as rich would, styles included: the same bytes, without its start-up."""

from __future__ import annotations

import functools
import json
import math
import os
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from eaglekit.cli import plain

CONSOLES = ("out", "err")
_consoles: dict[str, Console] = {}


def console(name: str) -> Console:
    """The console `out` (stdout) or `err` (stderr), made on first use. markup=False: names, paths and messages
    come from untrusted files and are printed as they are, never as rich markup; styles are applied through Text
    (styled()) only."""
    if name not in _consoles:
        from rich.console import Console

        _consoles[name] = Console(stderr=name == "err", highlight=False, soft_wrap=False, markup=False, emoji=False)
    return _consoles[name]


def screen_width() -> int:
    """The width stdout is laid out to: the `out` console's (a width set on it holds), or where none is made yet
    and eaglekit.cli.plain draws what rich would, the width rich would give it (eaglekit.cli.plain.screen_width)."""
    from eaglekit.cli import plain

    if "out" in _consoles or plain.output_mode(sys.stdout) is None:
        return console("out").width
    return plain.screen_width()


class Styled:
    """Text in parts, plain strings and (text, style) pairs as styled() takes them, kept so until it is printed:
    by rich, or by eaglekit.cli.plain (plain.marked: its characters and styled spans)."""

    __slots__ = ("parts",)

    def __init__(self, *parts: str | tuple[str, str]) -> None:
        self.parts = parts

    @property
    def plain(self) -> str:
        return "".join(part if isinstance(part, str) else part[0] for part in self.parts)

    def text(self) -> Text:
        return styled(*self.parts)


def _marked(value: Any) -> plain.Marked:
    """A cell's text and styles as printed: a Styled's, "—" for nothing."""
    from eaglekit.cli import plain

    return plain.marked(value.parts) if isinstance(value, Styled) else plain.Marked(
        "—" if value is None else str(value))


def _printed_plain(layout: Callable[[int], list[plain.Line]], texts: Iterable[plain.Marked]) -> bool:
    """Print `layout(width)`'s lines on stdout through eaglekit.cli.plain where they are exactly what rich would
    print: no console made yet (once one is, it is stdout's one writer, its width and any capture included), an
    output plain draws as rich would, every character one cell wide, every style one it writes. False: rich
    prints them."""
    from eaglekit.cli import plain

    mode = plain.output_mode(sys.stdout)
    texts = list(texts)
    if ("out" in _consoles or mode is None or not plain.one_cell([text.plain for text in texts])
            or not all(plain.known_style(style) for text in texts for _, _, style in text.spans)):
        return False
    try:
        lines = layout(plain.screen_width())
    except plain.Unfit:
        return False
    sys.stdout.write(plain.painted(lines, mode))
    sys.stdout.flush()
    return True


def print_text(text: str | Styled, *, wrap: bool = True) -> None:
    """Text on stdout: folded at the screen's width (`wrap`), else each of its lines as it is."""
    from eaglekit.cli import plain

    shown = _marked(text)
    if _printed_plain(lambda width: [plain.segments(line) for line in
                                     plain.wrap(shown, width, plain.FOLD if wrap else plain.IGNORE)], [shown]):
        return
    console("out").print(text.text() if isinstance(text, Styled) else text, soft_wrap=not wrap)


def print_panel(rows: list[tuple[str, Any]], title: str) -> None:
    """`rows` as key_value_table lays them out, in a panel under `title` (bold)."""
    from eaglekit.cli import plain

    keys, values = [key for key, _ in rows], [_marked(value) for _, value in rows]
    if _printed_plain(lambda width: plain.panel_lines(keys, values, title, width),
                      [*map(plain.Marked, keys), *values, plain.Marked(title)]):
        return
    from rich.panel import Panel

    console("out").print(Panel(key_value_table(rows), title=styled((title, "bold")), expand=False))


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str | Styled]], *,
                no_wrap: Sequence[bool] = (), overflow: Sequence[str] = ()) -> None:
    """`rows` under `headers` in a titled table with a heavy header rule (rich's default table); `no_wrap` and
    `overflow` per column as rich takes them (by default a cell wraps, and a word wider than its column is cut
    with "…")."""
    from eaglekit.cli import plain

    no_wrap = list(no_wrap) or [False] * len(headers)
    overflow = list(overflow) or [plain.ELLIPSIS] * len(headers)
    cells = [[_marked(value) for value in row] for row in rows]
    columns = [plain.Column(header, [row[i] for row in cells], no_wrap=no_wrap[i], overflow=overflow[i])
               for i, header in enumerate(headers)]
    if _printed_plain(lambda width: plain.table_lines(title, columns, width),
                      [*map(plain.Marked, [title, *headers]), *(value for row in cells for value in row)]):
        return
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for header, wraps_not, how in zip(headers, no_wrap, overflow):
        table.add_column(header, no_wrap=wraps_not, overflow=how)  # type: ignore[arg-type]
    for row in rows:
        table.add_row(*[value.text() if isinstance(value, Styled) else value for value in row])
    console("out").print(table)


def __getattr__(name: str) -> Console:
    """`from eaglekit.cli.output import out` (or `err`): the console, made then."""
    if name in CONSOLES:
        return console(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

format_option = click.option(
    "--format", "output_format", type=click.Choice(["human", "json"]), default="human", show_default=True,
    help="human: rich tables; json: one JSON document (its schema ships in eaglekit/schemas/).",
)

SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def list_items(value: str) -> list[str]:
    """The items of a list option such as `2,15,27` or `chat raw` (commas and/or spaces between them)."""
    return value.replace(",", " ").split()


def int_list(value: str, option: str, example: str) -> tuple[int, ...]:
    """Non-negative integers from a list such as `2,15,27` (commas and/or spaces between them)."""
    from eaglekit.errors import UsageError

    try:
        numbers = tuple(int(v) for v in list_items(value))
    except ValueError:
        raise UsageError(f"{option} {value!r}: expected comma-separated integers such as {example}") from None
    if not numbers or any(n < 0 for n in numbers):
        raise UsageError(f"{option} {value!r}: expected non-negative integers such as {example}")
    return numbers


def aux_ids(value: str | None, option: str = "--aux-layer-ids") -> tuple[int, ...] | None:
    """An aux-id option (vLLM convention); None when not given."""
    return None if value is None else int_list(value, option, "2,15,27")


def template_list(value: str) -> tuple[str, ...]:
    """Template names from --templates, --template or --eval-templates (`chat,system,raw` or `chat raw`); each is
    checked where the options are (eaglekit.decode.prompts.check_template)."""
    return tuple(list_items(value))


def conditions(context_tokens: str, template: str) -> dict[str, Any]:
    """VerifyOptions' condition fields from --context-tokens and --template: one value each is one condition, as
    before sweeps existed; lists are a sweep over every template with every context length."""
    contexts = int_list(context_tokens, "--context-tokens", "0,1024,2048")
    templates = template_list(template)
    return {"context_tokens": contexts[0] if len(contexts) == 1 else contexts,
            "template": templates[0] if len(templates) == 1 else templates}


def target_path(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--target: a local folder, its config.json, or a Hub id (through the Hugging Face cache, as DRAFT is)."""
    from eaglekit.target import resolve_target

    if value is None:
        return None
    resolved = resolve_target(value)
    if resolved != value:  # a Hub id: the report names its cached snapshot, the user the id
        ctx.meta.setdefault(GIVEN_KEY, {})[resolved] = value
    return resolved


target_quantization_option = click.option(
    "--target-quantization", type=click.Choice(["fp8", "nvfp4", "int8", "int4"]),
    help="Run the target with a served format's numerics: fp8 (E4M3 weights per channel, activations per token), "
         "nvfp4 (E2M1 in blocks of 16 with E4M3 scales, weights and activations), int8 (weights per channel) or "
         "int4 (weights in groups of 128); the report names the scheme and its granularity.")


def quantization_text(served: dict | None) -> str:
    """How a report's target computed: full precision, or the scheme and its granularity."""
    if not served:
        return "full precision (the checkpoint's weights in the run's dtype)"
    activations = served["activations"] or "unquantized"
    return f"{served['scheme']}: weights {served['weights']}; activations {activations} ({served['specification']})"


def acceptance_text(block: dict) -> Text:
    """What a report's τ means and the rule it was counted under, then the labels its figures carry."""
    from rich.text import Text

    from eaglekit.engines.vllm import describe_acceptance

    shown = Text(describe_acceptance(block))
    for label in block.get("labels") or []:
        shown.append(f"\n{label}", "bold yellow")
    return shown


def sampling_text(sampling: dict, *, replay: bool = False) -> str:
    """How a report's target chose its tokens; a sampled run says its figures are one seeded draw."""
    if sampling["seed"] is None:
        return "greedy"
    how = ("the target sampled each continuation, both drafts replayed on it (the law of vLLM's rejection sampling)"
           if replay else "vLLM's rejection sampling, the draft proposing its argmax")
    return (f"temperature {sampling['temperature']:g}, top-p {sampling['top_p']:g}: {how}; the figures are one draw, "
            f"seed {sampling['seed']}")


class SeedType(click.ParamType):
    """A --seed: an integer torch's generator takes, refused while the command line is read (one line, exit 2)
    rather than once the model has loaded."""

    name = "integer"

    def convert(self, value, param, ctx):
        from eaglekit.decode.sampling import SEED_RANGE, SEED_RANGE_TEXT
        from eaglekit.errors import UsageError

        seed = click.INT.convert(value, param, ctx)
        if not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
            raise UsageError(f"{param.opts[0] if param else '--seed'} {seed}: {SEED_RANGE_TEXT}")
        return seed


SEED = SeedType()


def sampling_options(*, seed: bool):
    """--temperature and --top-p (verify, compare, bench) and, where eaglekit draws the samples, --seed."""
    from eaglekit.decode.sampling import DEFAULT_SEED

    options = [
        click.option("--temperature", type=float, default=0.0, show_default=True,
                     help="Sample the target's tokens at this temperature, as vLLM's rejection sampler does (the "
                          "draft still proposes its argmax); 0: greedy."),
        click.option("--top-p", "top_p", type=float, default=1.0, show_default=True,
                     help="Sample from the smallest set of tokens holding this much probability (vLLM's top-p, "
                          "applied after the temperature); 1: all."),
    ]
    if seed:
        options.append(click.option("--seed", type=SEED, default=DEFAULT_SEED, show_default=True,
                                    help="Seed of the sampled decode's generator (with --temperature): the same "
                                         "seed gives the same tokens and counters."))

    def apply(fn):
        for option in reversed(options):
            fn = option(fn)
        return fn

    return apply


def vllm_options(when: str):
    """How vLLM runs where a command starts it: its Python, tensor parallelism and engine arguments, passed to the
    command as one `engine_options` (eaglekit.runtime.engine.EngineOptions). `when` names the setting under which
    they apply, e.g. "--engine vllm"."""
    options = [
        click.option("--engine-python",
                     help=f"{when}: the Python that has vLLM [default: $EAGLEKIT_VLLM_PYTHON, else "
                          ".vllm-env/bin/python of the working directory or the eaglekit checkout, as "
                          "scripts/vllm-env.sh makes it, else this one]."),
        click.option("--tensor-parallel-size", type=int, default=1, show_default=True,
                     help=f"{when}: vLLM's tensor parallelism, for a target that does not fit one device."),
        click.option("--engine-arg", "engine_args", multiple=True, metavar="KEY=VALUE",
                     help=f"{when}: a vLLM engine argument, repeatable (JSON values), e.g. max_model_len=8192."),
    ]

    def apply(fn):
        @functools.wraps(fn)
        def command(*args, engine_python, tensor_parallel_size, engine_args, **kwargs):
            from eaglekit.runtime.engine import EngineOptions, parse_engine_args

            engine = EngineOptions(python=engine_python, tensor_parallel_size=tensor_parallel_size,
                                   engine_args=parse_engine_args(engine_args))
            return fn(*args, engine_options=engine, **kwargs)

        for option in reversed(options):
            command = option(command)
        return command

    return apply


def given_flags(ctx: click.Context, *flags: str) -> list[str]:
    """Those of `flags` set on the command line or from the environment, not left at their defaults: an option that
    cannot apply is refused only when given."""
    from click.core import ParameterSource

    def given(flag: str) -> bool:
        param = next(p for p in ctx.command.params if flag in getattr(p, "opts", ()))
        return ctx.get_parameter_source(param.name or "") in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)

    return [flag for flag in flags if given(flag)]


def deprecated_alias(alias: str, canonical: str, dest: str, **attrs: Any):
    """`alias`, the old name of the option `canonical` (whose parameter is `dest`), kept for one release: listed in
    --help as a deprecated alias, its value passed on as `dest`'s, and one warning on stderr per command that uses
    it. Both at once is a usage error."""
    param = f"deprecated_{dest}"

    def apply(fn):
        @functools.wraps(fn)
        def command(*args, **kwargs):
            from click.core import ParameterSource

            from eaglekit.errors import UsageError

            value = kwargs.pop(param)
            if value is not None:
                ctx = click.get_current_context()
                if ctx.get_parameter_source(dest) == ParameterSource.COMMANDLINE:
                    raise UsageError(f"give {canonical} or its deprecated alias {alias}, not both")
                warned = ctx.meta.setdefault("eaglekit.deprecated_aliases", set())
                if alias not in warned:
                    warned.add(alias)
                    console("err").print(f"warning: {alias} is a deprecated alias of {canonical}; use {canonical}")
                kwargs[dest] = value
            return fn(*args, **kwargs)

        return click.option(alias, param, default=None, hidden=False, help=f"deprecated alias of {canonical}",
                            **attrs)(command)

    return apply


def data_options(produced_by: str):
    """The data a capture runs the target on (capture, finetune), passed to the command as one `data`
    (eaglekit.capture.plan.DataOptions). `produced_by` says who writes --generate's answers."""
    options = [
        click.option("--data", "data_file", type=click.Path(dir_okay=False),
                     help="JSONL text: {\"prompt\"}, {\"messages\"} or {\"text\"} per line (default: the bundled "
                          "training prompts, disjoint from verify's)."),
        click.option("--data-limit", type=int, help="Use only the first N records."),
        click.option("--generate", type=int, default=0, show_default=True,
                     help=f"Append the target's own greedy answer (up to N tokens) to each prompt, {produced_by}."),
        click.option("--context-tokens", type=int, default=0, show_default=True,
                     help="Prepend this many tokens of standard-library source to every --context-every-th prompt."),
        click.option("--context-every", type=int, default=4, show_default=True),
        click.option("--max-length", type=int, default=2048, show_default=True, help="Cut longer sequences."),
        click.option("--code-tokens", type=int, default=0, show_default=True,
                     help="Add about this many tokens of Python standard-library source (plain text)."),
        click.option("--templates", default="chat", show_default=True,
                     help="Prompt shapes in turn, one per prompt: chat, system (another system prompt), raw (Q:/A: "
                          "text without the chat template); e.g. chat,system,raw."),
    ]

    def apply(fn):
        @functools.wraps(fn)
        def command(*args, data_file, data_limit, generate, context_tokens, context_every, max_length, code_tokens,
                    templates, **kwargs):
            from eaglekit.capture.plan import DataOptions

            data = DataOptions(data_file=data_file, limit=data_limit, generate=generate,
                               context_tokens=context_tokens, context_every=context_every, max_length=max_length,
                               code_tokens=code_tokens, templates=template_list(templates))
            return fn(*args, data=data, **kwargs)

        for option in reversed(options):
            command = option(command)
        return command

    return apply


def decode_options(fn):
    """The options every command that decodes against a target shares (verify, compare): the target, k, the prompt
    set and how it is selected, where and in what dtype the target runs, the conditions (templates x context
    lengths) the prompts are decoded under, and their plot."""
    from eaglekit.decode.prompts import TEMPLATES

    options = [
        click.option("--target", required=True, callback=target_path,
                     help="Target model: a folder (Hugging Face layout, safetensors) or a Hub id, read through the "
                          "Hugging Face cache."),
        click.option("-k", "--num-speculative-tokens", "k", type=int, default=3, show_default=True,
                     help="Drafts per round (vLLM's num_speculative_tokens)."),
        click.option("--max-new-tokens", type=int, default=64, show_default=True,
                     help="Tokens generated per prompt turn."),
        click.option("--prompts", "prompts_file", type=click.Path(dir_okay=False),
                     help="JSONL prompts ({\"prompt\": ...}, {\"messages\": [...]} or {\"text\": ...} per line, "
                          "optional \"category\") or a prepared SPEED-Bench file (JSONL or parquet); default: the "
                          "bundled coding prompts."),
        click.option("--limit", type=int, help="Use only the first N prompts (conversations)."),
        click.option("--category", "categories", multiple=True,
                     help="Only prompts of this category, repeatable (SPEED-Bench's categories, e.g. coding; or a "
                          "JSONL \"category\" field)."),
        click.option("--turns", type=click.Choice(["first", "all"]), default="first", show_default=True,
                     help="SPEED-Bench conversations: the first user turn only, or every turn, each asked after the "
                          "target's own answer to the one before."),
        click.option("--context-tokens", default="0", show_default=True, metavar="N[,N...]",
                     help="Long-context mode: prepend this many tokens of Python standard-library source to every "
                          "prompt; a list (0,1024,2048) measures each length, the target loaded once."),
        click.option("--template", default="chat", show_default=True, metavar="NAME[,NAME...]",
                     help="How prompts reach the target: " + "; ".join(
                         f"{name}: {t.description}" for name, t in TEMPLATES.items())
                     + ". A list measures each, with every --context-tokens value."),
        click.option("--plot", type=click.Path(dir_okay=False),
                     help="Write a PNG of τ and per-position acceptance against context length, one line per "
                          "template (needs matplotlib: eaglekit[plot])."),
        click.option("--device", default="auto", show_default=True,
                     help="auto (CUDA when there is a device, else CPU), cpu or cuda[:N]; the report names it."),
        click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16", "float64"]),
                     default="auto", show_default=True,
                     help="auto: float32 on CPU, bfloat16 on CUDA; float64 with --target-quantization."),
        target_quantization_option,
    ]
    fn = sampling_options(seed=True)(fn)
    for option in reversed(options):
        fn = option(fn)
    return fn


def styled(*parts: str | tuple[str, str]) -> Text:
    """Text from plain strings and (text, style) pairs: the only way output gets styles."""
    from rich.text import Text

    return Text.assemble(*parts)


def json_safe(value: Any) -> Any:
    """JSON has no NaN or infinity: a non-finite number read from a hostile config is written as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def write_text_atomically(path: str, text: str) -> None:
    """A temporary file beside `path`, renamed over it: a failed write leaves no half file."""
    from eaglekit.io.publish import Staged, publish

    def write(stage: Staged) -> None:
        with open(stage.path, "w", encoding="utf-8") as fh:
            fh.write(text)

    publish(path, write, replace=True)


def printable_doc(doc: Any) -> Any:
    """A report as a human renderer prints it: every string in it (keys too) through eaglekit.redact.printable, so
    no account name, model id, path or server string it carries can start a line of its own. JSON output needs
    none of this: JSON escapes control characters itself."""
    from eaglekit.redact import printable

    if isinstance(doc, str):
        return printable(doc)
    if isinstance(doc, dict):
        return {printable_doc(k): printable_doc(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [printable_doc(v) for v in doc]
    return doc


def public_json(doc: Any) -> Any:
    """A document as eaglekit prints or saves it: finite numbers only, no secret, no local path beyond a folder's
    name (eaglekit.redact)."""
    from eaglekit.redact import public_report

    return public_report(json_safe(doc))


def emit_json(doc: Any) -> None:
    click.echo(json.dumps(public_json(doc), indent=2, sort_keys=False, allow_nan=False))


def write_report(path: str, doc: Any) -> None:
    """A JSON report saved to `path` (--save-report, --profile-out), as `public_json` makes it, atomically."""
    write_text_atomically(path, json.dumps(public_json(doc), indent=2, allow_nan=False) + "\n")


def finish_report(doc: dict, output_format: str, render: Callable[[dict], None], *, save_report: str | None = None,
                  draw: Callable[[], str] | None = None, given: dict[str, str] | None = None) -> None:
    """A measuring command's last steps: its JSON written to --save-report, its plot drawn, then the JSON or the
    tables (and where the plot went) printed, the tables naming paths as the user typed them (`given`)."""
    if save_report:
        write_report(save_report, doc)
    written = draw() if draw else None
    if output_format == "json":
        emit_json(doc)
        return
    render(with_given(doc, given or {}))
    if written:
        console("out").print(f"plot: {written}")


ROWS_PER_CODE = 10
"""A table shows this many findings of one rule, then a count: a hostile file with thousands of unknown tensors
still prints a screen, not megabytes (--format json lists every finding)."""


def findings_rows(findings: list[dict]) -> list[tuple[str, str, str, str]]:
    """(code, severity, pitfall, message) per finding shown: at most ROWS_PER_CODE of a code, then a count."""
    rows: list[tuple[str, str, str, str]] = []
    shown: dict[str, int] = {}
    for f in findings:
        shown[f["code"]] = shown.get(f["code"], 0) + 1
        if shown[f["code"]] <= ROWS_PER_CODE:
            rows.append((f["code"], f["severity"], f.get("pitfall") or "", f["message"]))
    rows += [(code, "", "", f"… and {count - ROWS_PER_CODE:,} more {code} findings (--format json lists them all)")
             for code, count in shown.items() if count > ROWS_PER_CODE]
    return rows


def print_prose_table(title: str, headers: tuple[str, ...], rows: Sequence[tuple[str, ...]],
                      styles: dict[int, Callable[[str], str | None]] | None = None) -> None:
    """Rows whose last cell is prose: a table when every word of that prose fits its column, else one row per line
    group (`first second … — prose` wrapped at spaces), so a path or command in the prose is never cut or split.
    `styles` gives a column's style from its value."""
    width = screen_width()
    styles = styles or {}
    fixed = [max([len(header)] + [len(r[i]) for r in rows]) for i, header in enumerate(headers[:-1])]
    room = width - 3 * len(headers) - 1 - sum(fixed)  # a space each side of each cell, a rule between them
    if all(len(word) <= room for r in rows for word in r[-1].split()):
        print_table(title, headers, [[Styled((v, styles[i](v) or "")) if i in styles else v for i, v in enumerate(r)]
                                     for r in rows], no_wrap=[True] * (len(headers) - 1) + [False])
        return
    print_text(title)
    for r in rows:
        head = " ".join(v for v in r[:-1] if v)
        for i, line in enumerate(packed_lines(f"  {head} —", r[-1].split(), width)):
            print_text(line if i else Styled((line[:len(r[0]) + 2], "bold"), line[len(r[0]) + 2:]), wrap=False)


def print_findings(findings: list[dict], title: str = "Findings") -> None:
    """Findings as print_prose_table lays them out: a path or command in a message is never cut."""
    print_prose_table(title, ("code", "severity", "pitfall", "message"), findings_rows(findings),
                      {1: SEVERITY_STYLE.get})


def identifier_table(title: str, columns: list[str], rows: list[list[str]], *, prose: str | None = None) -> None:
    """Print rows whose cells are names to copy (tensor names, paths): a table when it fits the terminal with
    every identifier whole, else each row as `first — column: value; …` lines within the width (an 80-column log
    keeps every header and every identifier whole); only the `prose` column may wrap."""
    fixed = [c for c in columns if c != prose]
    widths = {c: max([len(c)] + [len(str(r[columns.index(c)])) for r in rows]) for c in columns}
    needed = sum(widths[c] for c in fixed) + 3 * len(columns) + 1 + (12 if prose else 0)
    width = screen_width()
    if needed <= width:
        print_table(title, columns, [[str(v) for v in r] for r in rows], no_wrap=[c != prose for c in columns],
                    overflow=["fold" if c == prose else "ignore" for c in columns])
        return
    print_text(title)
    for r in rows:
        named = [f"{column}: {value}" for column, value in zip(columns[1:], r[1:]) if str(value)]
        for line in packed_lines(f"  {r[0]} —", [f"{n};" for n in named[:-1]] + named[-1:], width):
            print_text(line, wrap=False)


def packed_lines(head: str, units: list[str], width: int, indent: str = "    ") -> list[str]:
    """`head` and `units` joined by spaces into lines of at most `width` characters, continued under `indent`. A
    unit moves to the next line whole; one wider than a line is wrapped at its spaces, never inside a word (a path
    or a tensor name wider than the line stays whole on a line of its own)."""
    import textwrap

    lines, line = [], head
    for unit in units:
        if len(line) + 1 + len(unit) <= width:
            line = f"{line} {unit}" if line.strip() else line + unit
            continue
        lines.append(line)
        pieces = textwrap.wrap(unit, width - len(indent), break_long_words=False, break_on_hyphens=False) or [""]
        lines += [indent + p for p in pieces[:-1]]
        line = indent + pieces[-1]
    lines.append(line)
    return [line.rstrip() for line in lines if line.strip()]


def shell_word(word: str) -> str:
    """One argument quoted for a POSIX shell, as shlex.quote does; one holding a character that is not printable (a
    newline, an escape) in bash's $'...' form with that character escaped, so the printed command stays on its
    lines and still names the same argument."""
    import shlex

    if word.isprintable():
        return shlex.quote(word)
    escaped = "".join("\\" + c if c in "\\'" else c if c.isprintable() else ascii(c)[1:-1] for c in word)
    return f"$'{escaped}'"


def shell_command(command: str) -> str:
    """A command to print for pasting: as it is when every character of it is printable, else each argument
    re-quoted by shell_word (the same words when pasted, none of them able to start a line of its own)."""
    import shlex

    from eaglekit.redact import printable

    if command.isprintable():
        return command
    try:
        return " ".join(shell_word(w) for w in shlex.split(command))
    except ValueError:  # not a command shlex can split: shown, escaped, rather than run
        return printable(command)


SHELL_OPERATORS = frozenset({"&&", "||", "|", ";"})
"""Words of a printed command that join commands: kept as they are (quoted, they would be arguments)."""
COMMAND_WORDS = frozenset({"eaglekit", "python", "python3", "pip", "bash", "sh", "git", "cmake", "make", "vllm"})


def is_command(text: str) -> bool:
    """Whether a fix is a command to paste (else a sentence to read): it starts with a program eaglekit's fixes
    run, or a script or binary by its path."""
    first = text.split(maxsplit=1)[0] if text.strip() else ""
    return first in COMMAND_WORDS or first.endswith(".sh") or "/bin/" in first


def fix_lines(label: str, fix: str, width: int) -> list[str]:
    """A fix after `label` within `width`: a command continued with ` \\` between arguments (command_lines), a
    sentence wrapped at its spaces (a path in it is never split), its control characters as escapes."""
    from eaglekit.redact import printable

    if is_command(fix):
        try:
            return command_lines(label, fix, width)
        except ValueError:  # not a command shlex can split: shown as a sentence
            pass
    return packed_lines(label.rstrip(), printable(fix).split(), width)


def print_fix(label: str, fix: str, style: str = "bold") -> None:
    """A fix on stdout as fix_lines lays it out, the fix itself in `style`."""
    for i, line in enumerate(fix_lines(label, fix, screen_width())):
        head = label.rstrip() if i == 0 else ""
        print_text(Styled(head, (line[len(head):], style)), wrap=False)


GIVEN_KEY = "eaglekit.given"
"""Where target_path keeps what a Hub id resolved to (click's context meta), for given_paths."""


def print_prose(head: str, text: str, head_style: str = "", indent: str = "  ") -> None:
    """`head` (in `head_style`) and a sentence wrapped at its spaces within the width: a path or name in it is
    never split, one wider than a line stands whole on its own line."""
    start = head.rstrip() if head.strip() else head
    for i, line in enumerate(packed_lines(start, text.split(), screen_width(), indent)):
        if i == 0 and start.strip():
            print_text(Styled((line[:len(start)], head_style), line[len(start):]), wrap=False)
        else:
            print_text(line, wrap=False)


def given_paths(paths: Iterable[str | None], targets: Iterable[str | None] = (), *,
                resolved: dict[str, str] | None = None) -> dict[str, str]:
    """How the paths the user typed appear in a report (absolute, with symlinks resolved; a target's config.json
    by its folder; a Hub id's cached snapshot, from `resolved` or --target's callback) → as the user typed them,
    for with_given."""
    context = click.get_current_context(silent=True)
    given: dict[str, str] = dict(context.meta.get(GIVEN_KEY, {}) if context else {})
    given.update({path: typed for path, typed in (resolved or {}).items() if path != typed})
    for path, is_target in [*((p, False) for p in paths), *((p, True) for p in targets)]:
        if not path or path.startswith("hf://"):
            continue
        forms = {os.path.abspath(path), os.path.realpath(path)}
        given.update({form: path for form in forms if form != path})
        if is_target and os.path.isfile(path):  # a config.json or GGUF file: the report names its folder
            folder = os.path.dirname(path) or "."
            given.update({os.path.dirname(form): folder for form in forms if os.path.dirname(form) != folder})
    return given


def with_given(doc: Any, given: dict[str, str]) -> Any:
    """A report with every path the user typed written as typed (the human renderers print it; JSON keeps its own
    form): a whole path or the head of a longer one, never a part of another name."""
    if not given:
        return doc
    pattern = re.compile(r"(?<![\w./-])(" + "|".join(re.escape(k) for k in sorted(given, key=len, reverse=True))
                         + r")(?=$|[/\s'\"),;:\]`])")

    def walk(value: Any) -> Any:
        if isinstance(value, str):
            return pattern.sub(lambda m: given[m.group(1)], value)
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [walk(v) for v in value]
        return value

    return walk(doc)


def command_lines(label: str, command: str, width: int) -> list[str]:
    """A shell command after `label`, on one line when it fits `width`, else continued with ` \\` line ends (a shell
    joins them when the lines are pasted) between arguments only: an argument is never split, and one wider than a
    line stands whole on a line of its own. Each argument is quoted by shell_word."""
    import shlex

    words = [w if w in SHELL_OPERATORS else shell_word(w) for w in shlex.split(command)]
    if len(label) + len(" ".join(words)) <= width:
        return [label + " ".join(words)]
    lines, line = [], label.rstrip() if label.strip() else label
    for word in words:
        if line.strip() and len(line) + 1 + len(word) + 2 > width:
            lines.append(line)
            line = "    " + word
        else:
            line = f"{line} {word}" if line.strip() else line + word
    lines.append(line)
    return [f"{line} \\" for line in lines[:-1]] + lines[-1:]


def key_value_table(rows: list[tuple[str, Any]], title: str | None = None) -> Table:
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, title_justify="left", show_header=False, expand=False, box=None, pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")  # a long path or id is folded, never cut
    for key, value in rows:
        table.add_row(key, value.text() if isinstance(value, Styled) else
                      "—" if value is None else value if isinstance(value, Text) else str(value))
    return table


def key_value_panel(rows: list[tuple[str, Any]], title: Text) -> None:
    """`rows` in a titled panel when its longest identifier (a path: the longest run without a space) fits beside
    its key; else as `key: value` lines within the width, so a narrow log shows every path whole."""
    from rich.panel import Panel
    from rich.text import Text

    values = [(key, value.plain if isinstance(value, Text) else "—" if value is None else str(value))
              for key, value in rows]
    key_width = max(len(key) for key, _ in values)
    longest = max(len(word) for _, value in values for word in value.split())
    if key_width + longest + 8 <= console("out").width:
        console("out").print(Panel(key_value_table(rows), title=title, expand=False))
        return
    console("out").print(title)
    for key, value in values:
        first, *more = value.split("\n")
        for line in packed_lines(f"  {key}:", first.split(), console("out").width):
            console("out").print(line, soft_wrap=True)
        for extra in more:
            for line in packed_lines("    ", extra.split(), console("out").width):
                console("out").print(line, soft_wrap=True)


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.2f} {unit}"
        size /= 1000
    return f"{n} B"
