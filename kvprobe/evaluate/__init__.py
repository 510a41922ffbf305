"""The pipeline end to end: config -> inventory -> one-knob check -> fit -> probes -> signed verdict
(orchestrate), and what reads runs against each other (canary, compare) or plans one (plan)."""
