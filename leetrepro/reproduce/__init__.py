"""Reproducing the paper's tables: the paper's own numbers (``paper``), measured tables side by side
with them (``tables``), and the qualitative claims of Section 5.1 / Appendix D checked from data
(``claims``). The notebooks in ``notebooks/`` are thin layers over these modules."""
