"""Trellis analytics package."""
