"""tbljax.demo: the demo's made-up data, for examples and tests — labelled pattern images of a
few classes (what `tbljax demo` trains on).

>>> rng = np.random.default_rng(0)
>>> image = tbljax.demo.make_image(rng, 2)   # (64, 64, 3) uint8 of class tbljax.demo.CLASSES[2]
"""

from tbljax._src.tools.demo import CLASSES, make_image

__all__ = ["CLASSES", "make_image"]
