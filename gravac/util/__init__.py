"""Small helpers shared across gravac (no training, no transport): atomic file writes,
the size arithmetic the engine and the cost model share (sizes.py)."""
