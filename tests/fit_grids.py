"""The start grid the fitting tests share: a few Chinchilla starts around the usual basin, which
exercise the same code as the default (Hoffmann) grid without its 4,500-start cost."""

SMALL_GRID = {
    "a": [0.0, 5.0, 10.0],
    "b": [0.0, 5.0, 10.0],
    "e": [0.0, 0.5],
    "alpha": [0.5],
    "beta": [0.5],
}
