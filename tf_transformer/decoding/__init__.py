"""Decoding over the cached decoder step (section 6.1)."""
