"""Talk to one vLLM server and distrust what it says: HTTP and streams, /metrics, the facts a
comparison is pinned on (inventory, platform, one-knob check), and what a request needs to fit."""
