"""From the run directory's numbers to a signed, re-derivable decision: the evidence read back, the
checks against the bars, the decision per candidate, its schema, verify and sign."""
