"""translator."""
