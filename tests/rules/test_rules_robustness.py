"""Odd configs never crash the rule engine: either the reader refuses with one line, or every rule runs."""

from __future__ import annotations

import json
import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eaglekit.errors import EaglekitError
from eaglekit.families import load_draft
from eaglekit.rules import run_rules
from eaglekit.serving import serving_support
from tests.support.factory import make_draft

KEYS = [
    "architectures", "model_type", "num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
    "num_key_value_heads", "head_dim", "vocab_size", "draft_vocab_size", "target_hidden_size", "num_aux_hidden_states",
    "eagle_aux_hidden_state_layer_ids", "eagle_config", "fc_norm", "norm_output", "norm_before_fc",
    "norm_before_residual", "tie_word_embeddings", "rope_theta", "rope_parameters", "layer_types", "sliding_window",
    "speculators_config", "transformer_layer_config", "q_lora_rank", "index_topk", "use_aux_norm", "bias",
]
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 300) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(KEYS + ["proposal_methods"]), inner,
                                                               max_size=3),
    max_leaves=8,
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(patch=st.dictionaries(st.sampled_from(KEYS), JSON, min_size=1, max_size=4),
       layout=st.sampled_from(["vllm", "speculators", "specforge", "kimi"]))
def test_rules_survive_any_config_values(tmp_path_factory, patch, layout):
    path = str(tmp_path_factory.mktemp("d"))
    make_draft(path, layout, **({"attention": "mla"} if layout == "kimi" else {}))
    cfg_path = os.path.join(path, "config.json")
    with open(cfg_path) as fh:
        cfg = json.load(fh)
    cfg.update(patch)
    with open(cfg_path, "w") as fh:
        json.dump(cfg, fh)
    try:
        spec = load_draft(path)
    except EaglekitError:
        return  # the reader's one-line refusal is the right outcome for some configs
    report = run_rules(spec, engine="all", deep=True)
    assert all("\n" not in f.message for f in report.findings)
    serving_support(spec)
