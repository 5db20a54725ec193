"""Pure, deterministic models of inference deployments: no network, no I/O beyond the catalogs."""
