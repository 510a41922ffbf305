"""Concurrent-agent load: the conversations (workload), the client that drives them (generator),
server metrics sampled during a case (sampler) and the per-case numbers and comparisons (stats).
The load probe (kvprobe.probes.load) schedules cases over servers with these parts."""
