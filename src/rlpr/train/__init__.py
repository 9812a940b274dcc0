"""train: the loop (trainer), its set-up, the update, metrics, held-out evaluation, checkpoints,
the run directory, metrics tracking, progress and clean stops on signals."""
