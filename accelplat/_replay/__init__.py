"""Capture bundles: their format, the recorder, the replayer and their installation.

The public names are in :mod:`accelplat.replay`.
"""
