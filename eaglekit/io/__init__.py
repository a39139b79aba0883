"""Checkpoint I/O: header-only reading, tensor streaming, atomic writing."""
