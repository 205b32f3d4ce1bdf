"""Trellis overlay package."""
