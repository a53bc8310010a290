"""What is trained: the draft components' modules, their artifacts and the base models."""
