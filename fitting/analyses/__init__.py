"""What the fitted laws say: compute-optimal allocation, the frontier, transfer and replay,
alignment, data valuation, rank correlations, zero-shot figures; above `fitting.laws`. Nothing is
imported here."""
