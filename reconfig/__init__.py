"""Trellis reconfig package."""
