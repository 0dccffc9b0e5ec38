"""verl.trainer: the RL training loop and its support modules (checkpoints, metrics, tracking)."""
