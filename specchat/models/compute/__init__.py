"""The compute paths: packing for the native kernels, the packed cache, int8 and 4-bit paths,
the lean forward, exact rows."""
