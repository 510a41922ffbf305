"""The exit codes the sealed rules decide (kvprobe.errors' EXIT_*, as they were when the rules were sealed)."""

EXIT_OK = 0
EXIT_BAR_FAILED = 1
EXIT_INVALID = 3
EXIT_BROKEN = 4
EXIT_CANNOT_RUN = 2
