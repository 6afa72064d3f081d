"""tbljax.show: look at a dataset — a grid of samples as stored or as the loader serves them.

>>> tbljax.show.save_grid_png("train.tbl", "grid.png", count=16)
"""

from tbljax._src.tools.show import sample_grid, save_grid_png

__all__ = ["sample_grid", "save_grid_png"]
