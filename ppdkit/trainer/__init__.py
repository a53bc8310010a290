"""Training: the training methods (training_methods.py), their runs and the DeepSpeed worker Ray Train hosts."""
