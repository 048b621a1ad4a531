"""Plots of result records. matplotlib is optional and imported only inside plotting functions."""
