"""GGUF files: their bytes checked, their numbers turned into dimensions, their report, their conversion."""
