"""Needle retrieval: cases from a seed, token-exact placement, reasoning-aware scoring, summaries.

The probe itself (kvprobe/probes/needle.py) only wires these to the servers and the run directory.
"""
