"""What one run owns: its directory and events log (store), its time budget, and the context every
probe is handed. Probes write here; the verdict and the report read it back."""
