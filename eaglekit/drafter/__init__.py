"""The draft model at run time: modules, fused kernels and the step loop."""
