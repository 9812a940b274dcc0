"""train: the loop, the update, checkpoints, metrics tracking and progress."""
