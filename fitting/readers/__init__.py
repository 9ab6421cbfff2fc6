"""Readers at the bottom of `fitting`: run directories (xlscale's and T5X's, TensorBoard events),
the sweep's selection, model keys, and the fit inputs (points, curves, downstream series) built
from them. Nothing is imported here."""
