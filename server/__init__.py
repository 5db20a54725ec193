"""The front doors: the CLI and the MCP server, both generated from one registry of operations."""
