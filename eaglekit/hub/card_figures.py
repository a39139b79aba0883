"""The measured sections of a model card: verification, serving speed, why their τ differ, and a fine-tune's result.
Each states its figures with the conditions they hold under."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from eaglekit.config_view import nested
from eaglekit.decode import POOLED_TAU
from eaglekit.engines.vllm import EAGLEKIT_SETS, acceptance_settings, describe_acceptance
from eaglekit.hub.card_text import is_repo_id, number, public_source, signed, text


def sampled(report: Mapping[str, Any]) -> str:
    """How a verify or bench report's tokens were chosen, as the card states it."""
    sampling = report.get("sampling")
    if not isinstance(sampling, Mapping) or not sampling.get("temperature"):
        return "greedy"
    seed = f", seed {text(sampling['seed'])}" if sampling.get("seed") is not None else ""
    return f"temperature {text(sampling['temperature'])}, top-p {text(sampling.get('top_p', 1))}{seed}"


def verify_section(report: Mapping[str, Any], mismatches: Sequence[str] = (), *, speed: bool = True) -> str:
    """verify's figures; its reference-decode speed only when no bench report gives the serving speed (`speed`):
    a card states one speed, the engine's when it was measured."""
    rows = []
    if "lossless" in report and report["lossless"] is None:
        rows.append(("Sampling", f"{sampled(report)}: τ is one seeded draw; losslessness is not judged on one sample"))
    elif "lossless" in report:
        rows.append(("Lossless (greedy output identical to the target's)", "yes" if report["lossless"] else "**no**"))
    if "acceptance_length" in report:
        rows.append((f"Mean acceptance length: {POOLED_TAU}", number(report["acceptance_length"])))
    rule = report.get("acceptance_settings")
    if isinstance(rule, Mapping):
        rows.append(("Acceptance counted under", text(describe_acceptance(rule))))
    if "num_speculative_tokens" in report:
        rows.append(("Speculative tokens k", number(report["num_speculative_tokens"])))
    spec_tps, target_tps = report.get("tokens_per_s_spec"), report.get("tokens_per_s_target")
    if not speed:
        spec_tps = target_tps = None
    if spec_tps is not None:
        rows.append(("Tokens/s with the draft, eaglekit's reference decode", number(spec_tps, 1)))
    if target_tps is not None:
        rows.append(("Tokens/s, target alone, eaglekit's reference decode", number(target_tps, 1)))
    if isinstance(spec_tps, (int, float)) and isinstance(target_tps, (int, float)) and target_tps > 0:
        rows.append(("Reference-decode speed ratio (batch 1, not a serving engine: see `eaglekit bench`)",
                     f"{spec_tps / target_tps:.2f}×"))
    prompts = nested(measurements(report)[0][1], "prompts")
    if prompts:
        rows.append(("Prompts", f"{text(prompts.get('name', 'unnamed'))} ({number(prompts.get('count', '?'))})"))
    for key, label in (("dtype", "dtype"), ("device", "Device")):
        if key in report:
            rows.append((label, text(report[key])))
    target = nested(nested(report, "measured"), "target")
    if target:
        name = target.get("name_or_path")
        origin = name if is_repo_id(name) else f"a local copy in a folder named {text(target.get('folder'))}"
        if is_repo_id(name) and target.get("derived_from"):
            origin = f"{name}, as a local copy: {text(target['derived_from'])}"
        digest = text(str(target.get("config_sha256", ""))[7:19])
        rows.append(("Target measured", f"{origin} (config.json {digest}…)"))
    table = "\n".join(f"| {k} | {v} |" for k, v in rows)
    warning = ("> **Warning: these figures were measured on other files** than the ones published "
               f"({'; '.join(mismatches)}); this card was pushed with `--force`.\n\n") if mismatches else ""
    return (f"## Verification\n\n{warning}Measured with `eaglekit verify` against the target.\n\n| | |\n|---|---|\n"
            f"{table}\n{rule_labels(rule)}{tau_by_context(report)}{acceptance_by_depth(report)}")


def measurements(report: Mapping[str, Any]) -> list[tuple[Mapping[str, Any], Mapping[str, Any]]]:
    """Each condition a verify report measured with its figures: a sweep's conditions (template, context length),
    else the report itself under the context length its prompts record."""
    conditions = report.get("conditions")
    if isinstance(conditions, list):
        return [(c, c) for c in conditions if isinstance(c, Mapping)]
    return [({"context_tokens": nested(report, "prompts").get("context_tokens")}, report)]


def _interval_cell(figures: Mapping[str, Any], interval: Any) -> str:
    """An interval as the card writes it: low–high, or why there is none."""
    if figures.get("too_few_samples") is True:
        return f"n={number(figures.get('samples'))}, too few to estimate an interval"
    if isinstance(interval, Mapping):
        return f"{number(interval.get('low'))}–{number(interval.get('high'))}"
    return "—"


def _condition_cells(condition: Mapping[str, Any], sweep: bool) -> str:
    context = condition.get("context_tokens")
    return ((f"| {text(condition.get('template', '?'))} " if sweep else "")
            + f"| {'—' if context is None else number(context)} ")


def tau_by_context(report: Mapping[str, Any]) -> str:
    """τ under each condition of a sweep (template × context length), with its interval and n: where the draft
    holds as the prompt grows and where it drifts. Empty for a report of one condition (its τ is the table's)."""
    if not isinstance(report.get("conditions"), list):
        return ""
    lines = ["", "### τ by context length", "",
             f"{POOLED_TAU} per condition, with its 95 % bootstrap interval over conversations; n: conversations.", "",
             "| Template | Context tokens | Pooled τ | 95 % interval | n | Lossless |", "|---|---|---|---|---|---|"]
    for condition, figures in measurements(report):
        lossless = figures.get("lossless")
        lines.append(_condition_cells(condition, True) + f"| {number(figures.get('acceptance_length'))} | "
                     f"{_interval_cell(figures, figures.get('acceptance_length_interval'))} | "
                     f"{number(figures.get('samples', '—'))} | "
                     f"{'—' if lossless is None else 'yes' if lossless is True else '**no**'} |")
    return "\n".join(lines) + "\n"


def acceptance_by_depth(report: Mapping[str, Any]) -> str:
    """The acceptance rate at each draft depth 1..k with its interval and n, under each condition measured: where
    along the chain the draft holds and where it drifts."""
    found = [(c, f) for c, f in measurements(report) if isinstance(f.get("per_position_acceptance"), list)
             and f["per_position_acceptance"]]
    if not found:
        return ""
    sweep = isinstance(report.get("conditions"), list)
    lines = ["", "### Acceptance by draft depth", "",
             "At depth d: the share of drafting rounds whose first d drafts were all accepted (vLLM's per-position "
             "rate), with its 95 % bootstrap interval over conversations; given the drafts before it: the rate at d "
             "over the rate at d − 1; n: conversations.", "",
             ("| Template " if sweep else "") + "| Context tokens | Draft depth | Acceptance rate | 95 % interval | "
             "Given the drafts before it | n |", "|---" * (7 if sweep else 6) + "|"]
    for condition, figures in found:
        rates, conditional = figures["per_position_acceptance"], figures.get("conditional_acceptance") or []
        intervals = figures.get("per_position_acceptance_interval")
        for depth, rate in enumerate(rates, 1):
            interval = intervals[depth - 1] if isinstance(intervals, list) and len(intervals) == len(rates) else None
            given = number(conditional[depth - 1]) if len(conditional) == len(rates) else "—"
            lines.append(_condition_cells(condition, sweep) + f"| {depth} | {number(rate)} | "
                         f"{_interval_cell(figures, interval)} | {given} | {number(figures.get('samples', '—'))} |")
    return "\n".join(lines) + "\n"


def rule_labels(rule: Any) -> str:
    """The labels the acceptance rule puts on every τ of a section (a quantized draft head, a varying k, ...)."""
    labels = rule.get("labels") if isinstance(rule, Mapping) else None
    shown = [f"> τ above: {text(label)}" for label in labels or [] if isinstance(label, str)]
    return "\n" + "\n".join(shown) + "\n" if shown else ""


def bench_acceptance(bench: Mapping[str, Any]) -> Mapping[str, Any]:
    """The rule a bench report's τ was counted under: as it records it, else (a report that predates the record)
    from its speculative config, unknown for a server eaglekit did not start."""
    recorded = bench.get("acceptance_settings")
    if isinstance(recorded, Mapping):
        return recorded
    if nested(bench, "servers").get("started_by_eaglekit") is False:
        return acceptance_settings(None)
    given = {k: v for k, v in nested(bench, "speculative_config").items() if k not in EAGLEKIT_SETS}
    return acceptance_settings(given)


def swept_ks(bench: Mapping[str, Any]) -> str:
    """The k a bench report measured: its sweep ("1, 3, 5"), else its one k."""
    swept = bench.get("num_speculative_tokens_swept")
    if isinstance(swept, list) and swept and all(type(k) is int for k in swept):
        return ", ".join(str(k) for k in swept)
    return text(str(bench.get("num_speculative_tokens", "?")))


def speed_section(bench: Mapping[str, Any], mismatches: Sequence[str] = ()) -> str:
    """Serving speed as `eaglekit bench` measured it in the engine: the conditions first, then one row per
    concurrency (and category), then the verdict."""
    engine = nested(bench, "engine")
    prompts = nested(bench, "prompts")
    def field(block: Mapping[str, Any], key: str, default: str = "?") -> str:
        return text(block.get(key, default))

    conditions = (f"{field(engine, 'name', 'vllm')} {field(engine, 'version')} on {field(engine, 'device_name')} "
                  f"({field(engine, 'device_type')}, tensor parallel {field(engine, 'tensor_parallel_size', '1')}), "
                  f"{field(bench, 'dtype')}, k = {swept_ks(bench)}, {sampled(bench)}, up to "
                  f"{field(bench, 'max_new_tokens')} new tokens per request, prompts "
                  f"{field(prompts, 'name', 'unnamed')} ({number(prompts.get('count', '?'))})")
    rows = [r for r in bench.get("rows") or [] if isinstance(r, Mapping)]
    per_category = any(r.get("category") for r in rows)
    per_k = len({r.get("num_speculative_tokens") for r in rows}) > 1
    per_bucket = any(r.get("input_len") for r in rows)
    header = (("| Category " if per_category else "") + ("| k " if per_k else "")
              + ("| Input tokens " if per_bucket else "")
              + "| Concurrency | Per-user tokens/s, target alone | With the draft | Speed-up | 95 % interval "
                "| Pooled τ (engine) |")
    lines = [header, "|---" * (header.count("|") - 1) + "|"]
    for r in rows:
        base, spec = nested(r, "baseline"), nested(r, "speculative")
        interval = r.get("speed_up_interval")
        few = r.get("too_few_samples") is True
        tau = r.get("acceptance_length")
        lines.append(("| " + text(r.get("category") or "") + " " if per_category else "")
                     + (f"| {number(r.get('num_speculative_tokens'))} " if per_k else "")
                     + (f"| {number(r.get('input_len')) if r.get('input_len') else '—'} " if per_bucket else "")
                     + f"| {r['concurrency']} | {number(nested(base, 'per_user_tokens_per_s').get('mean'), 1)} | "
                     f"{number(nested(spec, 'per_user_tokens_per_s').get('mean'), 1)} | {r['speed_up']:.2f}× | "
                     + (f"n={number(r.get('samples'))}, too few to estimate an interval" if few
                        else f"{number(interval.get('low'), 2)}–{number(interval.get('high'), 2)}"
                        if isinstance(interval, Mapping) else "—")
                     + f" | {'—' if tau is None else number(tau, 2)} |")
    verdicts = [f"- {text(v['text'])}" for v in bench.get("verdicts") or [] if isinstance(v, Mapping) and "text" in v]
    warning = ("> **Warning: these figures were measured on other files** than the ones published "
               f"({'; '.join(mismatches)}); this card was pushed with `--force`.\n\n") if mismatches else ""
    rule = bench_acceptance(bench)
    return ("## Serving speed\n\n" + warning + "Measured with `eaglekit bench`: the target served alone and with this "
            "draft, on the same requests, by vLLM's own benchmark client (`vllm bench serve`) at each concurrency; "
            f"{text(describe_acceptance(rule))}, from the server's spec-decode counters. {conditions}.\n\n"
            + "\n".join(lines) + "\n" + rule_labels(rule) + ("\n" + "\n".join(verdicts) + "\n" if verdicts else ""))


def numerics_note(report: Mapping[str, Any], bench: Mapping[str, Any]) -> str:
    """Why the two sections' τ and "lossless" can differ: each is exact for its own numerics and prompts."""
    rows = [r for r in bench.get("rows") or [] if isinstance(r, Mapping)]
    identical = sum(r["identical_outputs"] for r in rows if isinstance(r.get("identical_outputs"), int))
    requests = sum(r["requests"] for r in rows if isinstance(r.get("requests"), int))
    lines = [f"τ can differ between the two sections: the verification is `eaglekit verify`'s decode in "
             f"{text(report.get('dtype', '?'))} on its prompts, the serving speed is the engine's own counters in "
             f"{text(bench.get('dtype', '?'))} on the benchmark's; other numerics and prompts give another τ, and "
             "each figure is exact for its setting."]
    if requests and identical < requests:
        lines.append(f"`eaglekit verify`'s output equals the target's; in the engine, {identical} of {requests} "
                     f"texts with the draft equal the target's alone: in {text(bench.get('dtype', '?'))}, batched "
                     "verification rounds differently from one token at a time, so a near-tie can flip a token (as "
                     "in vLLM itself); greedy speculative decoding is lossless in exact arithmetic.")
    return "\n".join(lines) + "\n"


def finetune_section(block: Mapping[str, Any]) -> str:
    """What the newest fine-tune did and measured (its provenance `block`): data, steps, the step kept, held-out τ
    before and after."""
    if block.get("command") != "finetune":
        return ""
    data, options = nested(block, "data"), nested(block, "evaluation_options")
    lines = ["## Fine-tuning", "",
             f"`eaglekit finetune` trained this draft from {public_source(block.get('source')) or 'its source'} on "
             f"{number(data.get('sequences', '?'))} sequences ({number(data.get('positions', '?'))} positions) for "
             f"{number(block.get('steps', '?'))} steps"
             + (f", keeping the weights of step {number(block['selected_step'])} ({text(block.get('selected_by'))}), "
                "the best on held-out training sequences" if block.get("selected_step") is not None else "") + "."]
    gain = nested(block, "held_out_gain")
    if not gain:
        lines += ["", f"Held-out acceptance: not measured ({text(block.get('written') or 'no evaluation')})."]
        return "\n".join(lines) + "\n"
    interval = nested(gain, "interval")
    few = gain.get("too_few_samples") is True
    span = (f" (n={number(gain.get('samples'))}, too few to estimate an interval)" if few
            else f" [{signed(interval.get('low'))}, {signed(interval.get('high'))}]" if interval else "")
    k = f", k = {number(options['k'])}" if "k" in options else ""
    lines += ["", f"Held-out acceptance against its input, paired on one target pass per prompt "
                  f"({number(gain.get('prompts', '?'))} prompts × {number(gain.get('conditions', '?'))} "
                  f"conditions{k}): τ {number(gain.get('before'))} → {number(gain.get('after'))}, difference "
                  f"{signed(gain.get('acceptance_length_difference'))}{span}, {text(gain.get('verdict'))}"
                  + (f" (it resolves ±{number(gain['resolvable'], 3)})" if gain.get("resolvable") else "")
                  + f"; written: {text(block.get('written', '?'))}.", "",
              "| Template | Context tokens | τ difference | 95 % interval | Verdict |", "|---|---|---|---|---|"]
    for p in block.get("paired_evaluation") or []:
        if isinstance(p, Mapping):
            bounds = nested(p, "interval")
            lines.append(f"| {text(p.get('template', '?'))} | {number(p.get('context_tokens', '?'))} | "
                         f"{signed(p.get('acceptance_length_difference'))} | "
                         + (f"n={number(p.get('samples'))}, too few to estimate an interval"
                            if p.get("too_few_samples") is True
                            else f"{signed(bounds.get('low'))} to {signed(bounds.get('high'))}" if bounds else "—")
                         + f" | {text(p.get('verdict', '?'))} |")
    return "\n".join(lines) + "\n"
