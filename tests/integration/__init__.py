"""Tests that drive real third-party engines; each skips where its engine is not installed."""
