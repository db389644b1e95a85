"""Per-layer taps inside the compiled step: each layer of the network wrapped in a cell that sees its
forward output and the gradient flowing back into it, to observe (statistics out of the step through a
probe's gradient) or to transform (a function of each). Names, layer discovery and the host-side reading
of the statistics are here; the cells are in lsexp.taps.cells, which imports MindSpore."""

# The statistics one tap carries out of the step. EXIT_STATS, from the cell after the layer: the largest
# magnitude of the layer's (transformed) output; grad_*: of the gradient flowing into that output, as the
# backward pass has it (scaled by the loss scale), the fractions by float16's limits. ENTRY_STATS, from the
# cell before it, which only the locator's replay asks for: the largest magnitude of the layer's input and
# of the gradient the layer passes back to it (not measured for an integer input).
EXIT_STATS = ("out_amax", "grad_amax", "underflow_fraction", "zero_fraction", "overflow_fraction")
ENTRY_STATS = ("in_amax", "grad_out_amax")
STATS = ("in_amax",) + EXIT_STATS + ("grad_out_amax",)  # a layer's, in the order values pass it
PASSES = ("forward", "backward")
