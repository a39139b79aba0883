"""Hidden-state capture: the target runs in a backend (the serving engine, or the reference hooks for small targets)
and its states stream into a resumable, sharded store that upgrade and finetune read without loading the target."""
