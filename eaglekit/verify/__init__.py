"""verify: run a draft against its target in a real speculative decode and report acceptance."""
