"""The curated knowledge base and the reasoning that applies it: diagnosis and planning."""
