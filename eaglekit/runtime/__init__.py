"""runtime: the real engines run as processes: vLLM's offline runs and server, in the Python that has vLLM.

Every process is started under eaglekit's process guard, so none outlives eaglekit. (eaglekit.engines holds what
is known about each engine's versions; this package runs one.)
"""
