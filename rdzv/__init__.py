"""rdzv: a model-checked elastic rendezvous with PyTorch's handler API."""
