"""What one run owns: its directory and events log (store), its time budget, a remembered Ctrl-C, and
the context every probe is handed. Probes write here; the verdict and the report read it back."""
