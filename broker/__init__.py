"""Trellis broker package."""
