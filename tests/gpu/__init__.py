"""Tests that need a real accelerator; each module skips itself cleanly where there is none."""
