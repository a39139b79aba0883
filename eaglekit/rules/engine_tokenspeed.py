"""tokenspeed rules: how tokenspeed 0.1.0 reads this checkpoint (eaglekit.engines.tokenspeed)."""

from __future__ import annotations

from eaglekit.engines.tokenspeed import ARCHITECTURES, TOKENSPEED, capture_flag_value, tokenspeed_capture
from eaglekit.rules.facts import fc_k_disagreeing, fmt_ids, not_one_layer
from eaglekit.rules.registry import Hit, RuleContext, rule


@rule("EK381", "warning", "engine", "P19", "tokenspeed captures other layers unless its flag pins them",
      engine=TOKENSPEED,
      fix="pass the --eagle3-layers-to-capture setting `eaglekit validate DRAFT --engine tokenspeed` prints")
def capture(ctx: RuleContext):
    intended = ctx.spec.aux.ids
    if not intended:
        return
    view = ctx.tokenspeed
    captured = tokenspeed_capture(view, ctx.target)
    if captured is not None and sorted(set(captured)) == sorted(set(intended)):
        return
    where = f"{view.ids_key} {fmt_ids(view.ids)}" if view.ids else "no ids (its default)"
    shift = " plus 1 (output-of-layer)" if view.shifted else ""
    got = fmt_ids(captured) if captured is not None else "a default that depends on the target"
    flag = capture_flag_value(intended, view.shifted)
    remedy = (f"serve with --eagle3-layers-to-capture {flag}" if flag
              else "no flag value names the embedding output: tokenspeed cannot serve this draft")
    yield Hit(f"tokenspeed reads {where}{shift} and captures {got}, but the draft was trained on {fmt_ids(intended)} "
              f"(vLLM convention): {remedy}", key=view.ids_key or "eagle_aux_hidden_state_layer_ids")


@rule("EK382", "error", "engine", "P11", "tokenspeed's K disagrees with fc", engine=TOKENSPEED, refuses_load=True)
def k_resolved(ctx: RuleContext):
    if K := fc_k_disagreeing(ctx.spec, ctx.tokenspeed.k):
        yield Hit(f"tokenspeed takes K={ctx.tokenspeed.k} from {ctx.tokenspeed.k_source} but fc.weight holds K={K}: "
                  f"loading fails on shape; write the {K} ids at the top level", key="eagle_aux_hidden_state_layer_ids")


@rule("EK383", "error", "engine", "P26", "draft hidden size differs from the target's (tokenspeed's Llama draft)",
      engine=TOKENSPEED, refuses_load=True, convertible=False,
      fix="serve it with vLLM, which sizes fc by the target's hidden size")
def target_width(ctx: RuleContext):
    g = ctx.spec.geometry
    if ctx.spec.attention != "mla" and g.target_hidden_size is not None and g.target_hidden_size != g.hidden_size:
        yield Hit(f"tokenspeed's Llama EAGLE-3 draft sizes fc as hidden_size x K ({g.hidden_size} x K) and fc_norm "
                  f"as hidden_size, but the target is {g.target_hidden_size} wide: loading fails on shape",
                  key="target_hidden_size")


@rule("EK384", "error", "engine", "P3", "a norm flag written where tokenspeed does not read it", engine=TOKENSPEED)
def flag_place(ctx: RuleContext):
    view, ec = ctx.tokenspeed, ctx.spec.config.get("eagle_config")
    if view.norm_output_ignored:
        yield Hit("norm_output is set only as eagle_config.return_hidden_post_norm, which tokenspeed never reads: it "
                  "feeds back the pre-norm state; write norm_output: true at the top level", key="norm_output")
    if isinstance(ec, dict) and ec.get("norm_before_fc") is True and not view.norm_before_fc:
        yield Hit("norm_before_fc is set only inside eagle_config; tokenspeed reads it at the top level and builds no "
                  "input_norm", key="eagle_config.norm_before_fc")


@rule("EK385", "error", "engine", "P2", "more than one draft layer, which tokenspeed refuses", engine=TOKENSPEED,
      refuses_load=True, convertible=False, fix="serve it with vLLM, which builds multi-layer drafts")
def one_layer(ctx: RuleContext):
    if n := not_one_layer(ctx.spec):
        yield Hit(f"{n} decoder layers: tokenspeed's EAGLE-3 drafts have exactly one", key="num_hidden_layers")


@rule("EK386", "error", "engine", "P14", "architecture tokenspeed has no EAGLE-3 class for", engine=TOKENSPEED,
      refuses_load=True)
def architecture(ctx: RuleContext):
    arch = ctx.tokenspeed.architecture
    wanted = ARCHITECTURES[1] if ctx.spec.attention == "mla" else ARCHITECTURES[0]
    if arch is None:
        yield Hit(f"config.json has no architectures list (the speculators layout): tokenspeed needs the flat layout "
                  f"with {wanted} (eaglekit upgrade --to sglang writes it)", key="architectures")
    elif arch not in ARCHITECTURES:
        renamed = arch if "Eagle" in arch else arch + "NextN"
        yield Hit(f"architectures[0] {arch!r} resolves to {renamed!r}, which is no tokenspeed EAGLE-3 class; "
                  f"write {wanted!r}", key="architectures")
