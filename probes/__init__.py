"""Everything that touches a live endpoint: the probe, the run store and the simulated engine."""
