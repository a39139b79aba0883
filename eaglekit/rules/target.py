"""Target rules: need the target's config.json (L, T, V, layer types); still no tensor values (but the decode
rules' d2t check, which reads that one small map)."""

from __future__ import annotations

from dataclasses import dataclass

from eaglekit.errors import MAX_QUOTED_CHARS
from eaglekit.findings import Finding
from eaglekit.rules.facts import fmt_ids
from eaglekit.rules.registry import Hit, RuleContext, rule
from eaglekit.spec import DraftSpec
from eaglekit.target import TargetInfo


def _target(ctx: RuleContext) -> TargetInfo:
    """The target these rules judge against: validate runs the target group only when it was given one."""
    assert ctx.target is not None, "target rules run only with a target"
    return ctx.target


@rule("EK201", "error", "target", "P28", "draft vocabulary size is not the target's",
      fix="write vocab_size as the target's vocabulary, or check that --target is the model the draft was built for")
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


@rule("EK202", "error", "target", "P26", "draft's T is not the target's hidden size",
      fix="check that --target is the model the draft was built for, else write its hidden size as target_hidden_size")
def target_hidden(ctx: RuleContext):
    T = ctx.spec.geometry.target_hidden
    hidden = _target(ctx).hidden_size
    if T != hidden:
        yield Hit(f"the draft expects target states of width T={T} but the target's hidden_size is "
                  f"{hidden}: a draft for another target, or target_hidden_size is wrong",
                  key="target_hidden_size")


@rule("EK203", "error", "target", "P18", "aux layer id outside [0, L]",
      fix="write aux ids within [0, L] of the target the draft was trained for, or check --target")
def ids_in_range(ctx: RuleContext):
    ids, L = ctx.spec.aux.ids, _target(ctx).num_layers
    if ids and any(i < 0 or i > L for i in ids):
        bad = [i for i in ids if i < 0 or i > L]
        yield Hit(f"aux ids {fmt_ids(ids)} (vLLM convention) include {fmt_ids(bad)}, outside [0, {L}] for this "
                  f"{L}-layer target: the engine fails or captures nothing there")


@rule("EK204", "info", "target", "P18", "aux layer id at a boundary (0 or L)",
      fix="nothing to fix for vLLM; for SGLang's Llama path write ids below L")
def ids_at_boundary(ctx: RuleContext):
    ids, L = ctx.spec.aux.ids, _target(ctx).num_layers
    if not ids:
        return
    if L in ids:
        yield Hit(f"aux id {L} = L is the final pre-norm state: valid in vLLM, but SGLang's Llama path shifts it to "
                  f"{L + 1}, out of range")
    if 0 in ids:
        yield Hit("aux id 0 is the embedding output, an unusual capture point")


@rule("EK205", "warning", "target", "P16", "aux ids equal the other convention's default",
      fix="check the ids against the training run and add the +1 shift where it was skipped")
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


@rule("EK206", "warning", "target", "P21", "hybrid target: an aux id does not capture after an attention layer",
      fix="check the ids are the layers the draft was trained on: hybrid targets train on attention layers")
def hybrid_ids(ctx: RuleContext):
    types, ids = _target(ctx).layer_types, ctx.spec.aux.ids
    if not types or all(_attention_layer(t) for t in types) or not ids:
        return
    bad = [i for i in ids if 1 <= i <= len(types) and not _attention_layer(types[i - 1])]
    if bad:
        yield Hit(f"hybrid target: aux ids {fmt_ids(bad)} capture the output of non-attention layers "
                  f"({', '.join(sorted({types[i - 1] for i in bad}))}); these drafts are trained on attention layers")


@rule("EK207", "error", "target", "P21", "hybrid target without recorded aux ids",
      fix="write the aux ids the draft was trained on")
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


# ---------------------------------------------------------------- a reference decode's rules
# A decode (verify, compare, finetune's evaluation) runs the draft against the target itself: it captures the aux ids
# of --aux-layer-ids or of the files, shares the target's embedding and head where the draft ships none, and maps
# draft ids through d2t. These rules judge the draft as written against that decode, which only the decode setup
# knows: it puts a DecodeReading in the context's memo (rules.decode_findings). An ordinary rules run (validate)
# leaves them out, and without a reading they stay silent. An error among them stops the decode before anything
# loads: a draft that does not fit would crash mid-decode or, worse, decode garbage.

DECODE = "decode_reading"  # the memo key
DECODE_CODES = ("EK291", "EK292", "EK293", "EK294", "EK295", "EK296", "EK297", "EK298", "EK299")


@dataclass(frozen=True)
class DecodeReading:
    """What the decode reads besides the files, and the command's vLLM rules run it compares its reading with."""

    aux_ids: tuple[int, ...] | None  # the ids it captures (vLLM convention); None: neither the files nor the user say
    aux_source: str
    num_aux: int | None  # K, as fc takes it
    vllm_version: str
    vllm_errors: tuple[Finding, ...]  # the errors of vLLM's rules at that version
    fix: str | None  # the upgrade that writes what vLLM reads


def _decode(ctx: RuleContext) -> tuple[DecodeReading, TargetInfo] | None:
    reading = ctx.memo.get(DECODE)
    return None if reading is None else (reading, _target(ctx))


@rule("EK291", "info", "target", None, "decode: the draft records no vocabulary size, the target's is assumed",
      fix="write vocab_size in the draft's config.json")
def decode_vocab_unrecorded(ctx: RuleContext):
    if (found := _decode(ctx)) is not None and ctx.spec.vocab.vocab_size is None:
        yield Hit(f"draft does not record its vocabulary size; the target's V={found[1].vocab_size} is assumed",
                  key="vocab_size")


@rule("EK292", "error", "target", None, "decode: the draft's vocabulary is not the target's",
      fix="decode against the target the draft was built for (its vocabulary)")
def decode_vocab(ctx: RuleContext):
    if (found := _decode(ctx)) is None:
        return
    V, draft_v = found[1].vocab_size, ctx.spec.vocab.vocab_size
    if draft_v is not None and draft_v != V:
        yield Hit(f"draft vocabulary V={draft_v}, the target has V={V}", key="vocab_size")


@rule("EK293", "error", "target", "P26", "decode: the draft's T does not fit the target's hidden size",
      fix="decode against the target the draft was built for (its hidden size), or write target_hidden_size")
def decode_target_hidden(ctx: RuleContext):
    if (found := _decode(ctx)) is None:
        return
    spec, T = ctx.spec, found[1].hidden_size
    written = spec.facts.target_hidden_size_written or spec.facts.fc_norm_tensor_ids
    fc_in = spec.facts.fc_in_features
    if written and spec.geometry.target_hidden_size != T:
        yield Hit(f"draft expects target hidden size T={spec.geometry.target_hidden_size}, the target has T={T}",
                  key="target_hidden_size")
    elif fc_in is not None and fc_in % T:
        yield Hit(f"fc takes {fc_in} inputs, not a multiple of the target's hidden size T={T}", tensor="fc.weight")


@rule("EK294", "error", "target", None, "decode: aux layer ids unknown, outside [0, L], duplicated or not K",
      fix="pass --aux-layer-ids (vLLM convention): K distinct ids within [0, L], the layers the draft was trained on")
def decode_aux_ids(ctx: RuleContext):
    if (found := _decode(ctx)) is None:
        return
    reading, L = found[0], found[1].num_layers
    ids, k = reading.aux_ids, reading.num_aux
    if ids is None:
        yield Hit(f"aux layer ids are unknown ({reading.aux_source}); pass --aux-layer-ids (vLLM convention)")
    elif bad := [i for i in ids if not 0 <= i <= L]:
        yield Hit(f"aux layer ids {bad} lie outside [0, L={L}] of the target")
    elif len(set(ids)) != len(ids):
        yield Hit(f"aux layer ids {list(ids)} have duplicates (P20)")
    elif k is not None and len(ids) != k:
        yield Hit(f"{len(ids)} aux layer ids {list(ids)} but fc takes K={k} target states")


@rule("EK295", "error", "target", "P26", "decode: embed_tokens neither fits nor can be shared with the target",
      fix=("ship the draft's own embed_tokens.weight [V, H] from the training checkpoint, or decode against the target"
           " the draft was built for"))
def decode_embed_tokens(ctx: RuleContext):
    if (found := _decode(ctx)) is None:
        return
    spec, target = ctx.spec, found[1]
    H, T, V = spec.geometry.hidden_size, target.hidden_size, target.vocab_size
    if spec.has_embed_tokens:
        rows, width = spec.tensors["embed_tokens.weight"].shape
        if (rows, width) != (V, H):
            yield Hit(f"draft's own [{rows}, {width}], expected [V={V}, H={H}]", tensor="embed_tokens.weight")
    elif H != T:
        yield Hit(f"the draft ships no embed_tokens and its H={H} differs from the target's T={T}: the target's "
                  "embedding cannot be shared (P26)")


@rule("EK296", "error", "target", "P5", "decode: lm_head neither fits nor can be shared with the target",
      fix="ship lm_head.weight from the training checkpoint, or decode against the target the draft was built for")
def decode_lm_head(ctx: RuleContext):
    if (found := _decode(ctx)) is None:
        return
    spec, target = ctx.spec, found[1]
    H, T, V = spec.geometry.hidden_size, target.hidden_size, target.vocab_size
    Vd = spec.vocab.draft_vocab_size or V
    if spec.has_lm_head:
        rows = spec.tensors["lm_head.weight"].shape[0]
        if rows != Vd:
            yield Hit(f"draft's own, {rows} rows, expected Vd={Vd}", tensor="lm_head.weight")
    elif Vd != V:
        yield Hit(f"the draft ships no lm_head but its vocabulary Vd={Vd} is not the target's V={V} (P5)")
    elif H != T:
        yield Hit(f"the draft ships no lm_head and its H={H} differs from the target's T={T}")


def _smaller_head(ctx: RuleContext) -> int | None:
    """The draft's vocabulary Vd when a decode maps it onto the target's larger one."""
    if (found := _decode(ctx)) is None:
        return None
    Vd = ctx.spec.vocab.draft_vocab_size
    return Vd if Vd and Vd < found[1].vocab_size else None


@rule("EK297", "warning", "target", "P4", "decode: Vd < V without a d2t map",
      fix="restore d2t from the training checkpoint")
def decode_d2t_missing(ctx: RuleContext):
    Vd = _smaller_head(ctx)
    if Vd is not None and "d2t" not in ctx.spec.tensors:
        yield Hit(f"draft vocabulary Vd={Vd} < V={_target(ctx).vocab_size} but the draft has no d2t map (P4): vLLM "
                  "silently maps draft id i to target id i, and so does this decode; the trained map is lost")


@rule("EK298", "error", "target", None, "decode: d2t maps outside the target vocabulary or two ids to one",
      fix="restore d2t from the training checkpoint: offsets that map each draft id to its own target id")
def decode_d2t(ctx: RuleContext):
    Vd = _smaller_head(ctx)
    if Vd is None or "d2t" not in ctx.spec.tensors:
        return
    import numpy as np  # imported where values are judged: loading the rules (inspect) stays numpy-free

    from eaglekit.io.tensors import read_array

    V = _target(ctx).vocab_size
    ids = np.arange(Vd) + read_array(ctx.spec, "d2t").astype(np.int64).reshape(-1)[:Vd]
    if ids.min() < 0 or ids.max() >= V:
        yield Hit(f"d2t maps draft ids outside the target vocabulary [0, {V})", tensor="d2t")
    elif len(np.unique(ids)) != Vd:
        yield Hit("d2t maps two draft ids to the same target id", tensor="d2t")


@rule("EK299", "warning", "target", None, "decode: vLLM reads the files otherwise than this decode",
      fix=("run the upgrade the finding names so vLLM reads what this decode reads, or measure both with `--engine "
           "both`"))
def decode_served_as_written(ctx: RuleContext):
    """What vLLM does with these files as they are: the decode reads them as eaglekit does, which may differ."""
    if (found := _decode(ctx)) is None or not found[0].vllm_errors:
        return
    reading = found[0]
    first, errors = reading.vllm_errors[0], len(reading.vllm_errors)
    more = f" (+{errors - 1} more)" if errors > 1 else ""
    whole = reading.fix and all(len(word) <= MAX_QUOTED_CHARS for word in reading.fix.split())
    # a finding cuts long words (hostile names): a command with a long path is named, not printed cut
    fix = (f"; `{reading.fix}` writes what it reads" if whole
           else "; `eaglekit upgrade` writes what it reads (`eaglekit validate` prints the command)" if reading.fix
           else "")
    yield Hit(f"served as written, vLLM {reading.vllm_version} differs from this reading: {first.code} "
              f"{first.message}{more}; `--engine both` measures what it does{fix}")
