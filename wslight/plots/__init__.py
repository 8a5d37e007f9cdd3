"""Matplotlib figures shared by TensorBoard logging and the report (Agg backend, no screen needed)."""

import matplotlib

matplotlib.use("Agg")
