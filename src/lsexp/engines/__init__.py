"""The train step, built by the engine group around the strategy: as ms.Model builds it (cell), or as
MindSpore 2.x teaches for custom loops (functional); what both share is the step body (recorder) and
the statistics it reports by name (stats)."""
