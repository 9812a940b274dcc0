"""rlpr's version, in a module of its own: modules that print it (the model card) import this, never
the package root `rlpr`, whose lazy attributes import the API and the training loop (an import
cycle through the root; tests/test_layout.py checks that no module imports it)."""

__version__ = "0.1.0"
