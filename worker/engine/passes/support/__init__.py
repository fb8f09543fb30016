"""Helpers shared by several passes: no module here registers a pass."""
