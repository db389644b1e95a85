"""Eight-bit training recipes: which tensors of each matrix product are quantised, to which format, with
which per-tensor scale (conf/precision/, docs/eight_bit.md)."""
