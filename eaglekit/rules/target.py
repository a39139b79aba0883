"""Target rules: need the target's config.json (L, T, V, layer types); still no tensor values."""

from __future__ import annotations

from eaglekit.rules.facts import fmt_ids
from eaglekit.rules.registry import Hit, RuleContext, rule
from eaglekit.spec import DraftSpec
from eaglekit.target import TargetInfo


def _target(ctx: RuleContext) -> TargetInfo:
    """The target these rules judge against: validate runs the target group only when it was given one."""
    assert ctx.target is not None, "target rules run only with a target"
    return ctx.target


@rule("EK201", "error", "target", "P28", "draft vocabulary size is not the target's")
def target_vocab(ctx: RuleContext):
    spec, t = ctx.spec, _target(ctx)
    written = spec.facts.config_vocab_size
    embed = spec.tensors.get("embed_tokens.weight")
    for what, v in (("vocab_size", written), ("embed_tokens.weight rows", embed.shape[0] if embed else None)):
        if v is not None and v != t.vocab_size:
            yield Hit(f"{what} is {v} but the target's vocabulary has {t.vocab_size} tokens: vocab_size must be the "
                      "target's V even when the draft head is smaller", key="vocab_size")
    if spec.vocab.draft_vocab_size > t.vocab_size:
        yield Hit(f"the draft head has {spec.vocab.draft_vocab_size} rows, more than the target's {t.vocab_size} "
                  "tokens", tensor="lm_head.weight")


@rule("EK202", "error", "target", "P26", "draft's T is not the target's hidden size")
def target_hidden(ctx: RuleContext):
    T = ctx.spec.geometry.target_hidden
    hidden = _target(ctx).hidden_size
    if T != hidden:
        yield Hit(f"the draft expects target states of width T={T} but the target's hidden_size is "
                  f"{hidden}: a draft for another target, or target_hidden_size is wrong",
                  key="target_hidden_size")


@rule("EK203", "error", "target", "P18", "aux layer id outside [0, L]")
def ids_in_range(ctx: RuleContext):
    ids, L = ctx.spec.aux.ids, _target(ctx).num_layers
    if ids and any(i < 0 or i > L for i in ids):
        bad = [i for i in ids if i < 0 or i > L]
        yield Hit(f"aux ids {fmt_ids(ids)} (vLLM convention) include {fmt_ids(bad)}, outside [0, {L}] for this "
                  f"{L}-layer target: the engine fails or captures nothing there")


@rule("EK204", "info", "target", "P18", "aux layer id at a boundary (0 or L)")
def ids_at_boundary(ctx: RuleContext):
    ids, L = ctx.spec.aux.ids, _target(ctx).num_layers
    if not ids:
        return
    if L in ids:
        yield Hit(f"aux id {L} = L is the final pre-norm state: valid in vLLM, but SGLang's Llama path shifts it to "
                  f"{L + 1}, out of range")
    if 0 in ids:
        yield Hit("aux id 0 is the embedding output, an unusual capture point")


@rule("EK205", "warning", "target", "P16", "aux ids equal the other convention's default")
def ids_other_default(ctx: RuleContext):
    aux, L = ctx.spec.aux, _target(ctx).num_layers
    if aux.as_written is None or aux.convention is None:
        return
    input_default, output_default = (2, L // 2, L - 3), (1, L // 2 - 1, L - 4)
    if aux.convention == "input" and tuple(aux.as_written) == output_default:
        yield Hit(f"aux ids {fmt_ids(aux.as_written)} are read as input-of-layer but equal the output-of-layer default "
                  f"for L={L}: probably copied without +1; vLLM ids would be {fmt_ids(input_default)}")
    if aux.convention == "output" and tuple(aux.as_written) == input_default:
        yield Hit(f"aux ids {fmt_ids(aux.as_written)} are read as output-of-layer but equal vLLM's default for L={L}: "
                  f"probably already shifted; +1 makes them {fmt_ids(aux.ids or ())}")


def _attention_layer(kind: str) -> bool:
    kind = kind.lower()
    return "attention" in kind and "linear" not in kind


@rule("EK206", "warning", "target", "P21", "hybrid target: an aux id does not capture after an attention layer")
def hybrid_ids(ctx: RuleContext):
    types, ids = _target(ctx).layer_types, ctx.spec.aux.ids
    if not types or all(_attention_layer(t) for t in types) or not ids:
        return
    bad = [i for i in ids if 1 <= i <= len(types) and not _attention_layer(types[i - 1])]
    if bad:
        yield Hit(f"hybrid target: aux ids {fmt_ids(bad)} capture the output of non-attention layers "
                  f"({', '.join(sorted({types[i - 1] for i in bad}))}); these drafts are trained on attention layers")


@rule("EK207", "error", "target", "P21", "hybrid target without recorded aux ids")
def hybrid_no_ids(ctx: RuleContext):
    types = _target(ctx).layer_types
    if types and not all(_attention_layer(t) for t in types) and ctx.spec.aux.as_written is None:
        yield Hit("hybrid target (attention mixed with other layer types) and no aux ids recorded: the engine "
                  "default may pick non-attention layers; write the ids the draft was trained on")


def wrong_target(spec: DraftSpec, target: TargetInfo) -> str | None:
    """One line when the draft as written disagrees with the target in two or more of T, V and the layers its aux
    ids need: then --target is more likely the wrong model than the draft wrong in each of them (None otherwise).
    Judged on the draft before the target filled its gaps (a T read off the target would hide the mismatch)."""
    own = spec.as_written
    T, V, ids = own.geometry.target_hidden, own.facts.config_vocab_size or own.vocab.vocab_size, own.aux.ids
    L = max(ids) if ids else None
    built = {"H": T, "V": V, "L≥": L}
    has = {"H": target.hidden_size, "V": target.vocab_size, "L≥": target.num_layers}
    differs = [k for k, v in built.items() if v is not None and (has[k] < v if k == "L≥" else has[k] != v)]
    if len(differs) < 2:
        return None
    drafted = ", ".join(f"{k}{'' if k.endswith('≥') else '='}{v}" for k, v in built.items() if v is not None)
    theirs = " / ".join(str(has[k]) for k, v in built.items() if v is not None)
    return (f"this draft was built for {drafted}; the target has {theirs}: is --target the right model? "
            "(the errors below follow from that)")
