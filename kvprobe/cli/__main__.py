"""`python -m kvprobe.cli`."""

from kvprobe.cli import main

main()
