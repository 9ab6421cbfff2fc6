"""What `xlscale fit` writes: fits.json, the Markdown report, the plots, and the papers' values
set beside ours; the top of `fitting`. Nothing is imported here."""
