"""decode: eaglekit's reference speculative decode and what every measurement of a draft shares.

The one setup (drafts checked against the target, prompts, the target loaded), the greedy and speculative loops
with the EAGLE proposer, acceptance counters and their statistics, and the paired comparison of drafts on one
captured target pass. verify, compare, finetune's evaluation, upgrade and bench all decode through it; the verify
command's own report and diagnosis live in eaglekit.verify. Importing this package does not import torch.
"""

POOLED_TAU = "pooled τ (1 + Σ accepted / Σ drafting rounds)"
"""What every report and card calls τ (eaglekit.decode.metrics: `AcceptanceCounter.acceptance_length` over merged
counters). Defined here, where importing it loads nothing else: the engine records quote it."""
