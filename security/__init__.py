"""Trellis security package."""
