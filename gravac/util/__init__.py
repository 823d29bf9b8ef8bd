"""Small helpers shared across gravac (no training, no transport): atomic file writes."""
