"""Other libraries' models on this project's kernels (each an optional dependency, imported only
by its own module): :mod:`leetrepro.integrations.transformers`."""
