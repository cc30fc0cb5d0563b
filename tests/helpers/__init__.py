"""Test helpers shared across test folders (real external services, tiny fixtures)."""
