"""Recovery fine-tuning of a draft against its target (training-time test)."""
