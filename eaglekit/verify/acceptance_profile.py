"""Speculation profiles: the measured acceptance of a draft in specdec_bench's `speculation_profile.json` (schema
1.0), and the same figures as vLLM's `synthetic_acceptance_rates`.

Two consumers read acceptance in two conventions, so both are written and named: Dynamo reads *conditional* rates
(P(draft i+1 accepted | the first i were)), vLLM's synthetic rejection sampler reads *marginal* ones (P(the first
i+1 drafts all accepted): unconditional, length K, non-increasing), which are exactly vLLM's own per-position
counters over drafts. The histogram is keyed by acceptance length (tokens emitted per round, the target's bonus
token included, so 1 means no draft was accepted), as specdec_bench keys it.
"""

from __future__ import annotations

from collections.abc import Sequence

from eaglekit.decode.metrics import AcceptanceCounter

SCHEMA_VERSION = "1.0"
CONSISTENCY_TOLERANCE = 0.02  # specdec_bench's own tolerance on AL vs 1 + Σ marginal


def public_id(path: str | None) -> str | None:
    """The last two components of a path (an org/name on the Hub): a published profile carries no local layout."""
    parts = [p for p in str(path or "").replace("\\", "/").split("/") if p]
    return "/".join(parts[-2:]) if parts else None


def length_histogram(counter: AcceptanceCounter) -> dict[str, int]:
    """Rounds per acceptance length 1..K+1 (only lengths that occurred), from the per-position counters."""
    at_least = [counter.drafts, *counter.accepted_at, 0]  # rounds with >= i drafts accepted
    counts = {str(i + 1): at_least[i] - at_least[i + 1] for i in range(counter.k + 1)}
    return {length: n for length, n in counts.items() if n}


def _checks(mean: float, marginal: Sequence[float]) -> dict:
    implied = 1.0 + sum(marginal)
    violations = [{"position": i, "value": marginal[i], "previous": marginal[i - 1]}
                  for i in range(1, len(marginal)) if marginal[i] > marginal[i - 1] + 1e-9]
    return {
        "mean_consistency": {"implied_mean_accept_length": round(implied, 6),
                             "reported_mean_accept_length": round(mean, 6),
                             "abs_delta": round(abs(implied - mean), 6), "tolerance": CONSISTENCY_TOLERANCE,
                             "passed": abs(implied - mean) <= CONSISTENCY_TOLERANCE},
        "marginal_monotonicity": {"passed": not violations, "violations": violations},
    }


def _category_entry(row: dict) -> dict:
    """A category in the profile's own vocabulary (mean_accept_length and the two rate vectors)."""
    return {"mean_accept_length": round(row["acceptance_length"], 6),
            "mean_accept_length_interval": row["acceptance_length_interval"],
            "marginal_accept_rates": [round(r, 6) for r in row["per_position_acceptance"]],
            "conditional_accept_rates": [round(r, 6) for r in row["conditional_acceptance"]],
            "num_steps": row["num_drafts"], "num_requests": row["prompts"]}


def speculation_profile(counter: AcceptanceCounter, *, per_request: Sequence[float], draft: str, target: str,
                        eagle_version: str, per_category: dict[str, dict] | None, conditions: dict) -> dict:
    """A measured profile in schema 1.0. `per_request`: τ of each prompt turn (specdec_bench's per-request mean
    weights a short request like a long one, so it is reported beside the per-round mean, never instead of it)."""
    marginal = [round(r, 6) for r in counter.per_position]
    mean = counter.acceptance_length
    return {
        "schema_version": SCHEMA_VERSION,
        "measured": True,
        "method": "eagle3",
        "draft_checkpoint": {"id": public_id(draft), "eagle_version": eagle_version},
        "target_model": {"id": public_id(target)},
        "num_speculative_tokens": counter.k,
        "block_size": None,
        "max_supported_k": counter.k,
        "verification_method": "longest_prefix",
        "conditional_accept_rates": [round(r, 6) for r in counter.conditional],
        "marginal_accept_rates": marginal,
        "mean_accept_length": round(mean, 6),
        "mean_accept_length_per_request": round(sum(per_request) / len(per_request), 6) if per_request else None,
        "accept_length_model": "chain_analytic",  # a chain draft: the K=n draft is a prefix of the K=n+1 one
        "accept_length_by_k": {str(counter.k): round(mean, 6)},
        "acceptance_length_histogram": length_histogram(counter),
        "per_category": {name: _category_entry(row) for name, row in per_category.items()} if per_category else None,
        "measurement_conditions": conditions,
        "validation": _checks(mean, marginal),
    }


def vllm_synthetic_config(counter: AcceptanceCounter) -> dict:
    """The speculative-config keys that make vLLM's synthetic rejection sampler replay this acceptance."""
    return {"num_speculative_tokens": counter.k, "rejection_sample_method": "synthetic",
            "synthetic_acceptance_rates": [round(r, 6) for r in counter.per_position]}
