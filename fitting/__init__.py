"""Scaling-law fitting for xlscale: laws, robust multi-start fits, allocation, transfer, downstream
laws, alignment, data valuation, readers of run directories, plots and reports.

Import the modules you need (`fitting.laws.robust_fit`, `fitting.reports.fit_all`, ...); nothing is imported here, so
`import fitting` stays light (no JAX, no TensorFlow).
"""
