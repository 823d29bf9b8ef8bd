"""Training support: models, data loading and sharding (pure PyTorch, no torchvision)."""
