"""train: the loop (trainer), its set-up, the update, metrics, held-out evaluation, checkpoints,
the run directory, metrics tracking, progress and clean stops on signals.

The package is also `rlpr.train(cfg)`, the Python API's training call (rlpr/api.py): importing a
submodule binds the name `train` on `rlpr` to this package, so the package itself must be the
callable (a module subclass with `__call__`; its submodules are unaffected)."""

import sys
import types


class _Callable(types.ModuleType):
    def __call__(self, *args, **kwargs):
        from rlpr.api import train

        return train(*args, **kwargs)


sys.modules[__name__].__class__ = _Callable
