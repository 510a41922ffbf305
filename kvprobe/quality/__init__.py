"""Quality against the reference: lm-eval as the loglikelihood engine (lmeval), passages planned
across prefill chunks (passages), perplexities and paired deltas (perplexity_stats), and
token-level agreement from prompt logprobs (divergence). Probes: perplexity, agreement."""
