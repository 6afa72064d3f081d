"""tbljax.torch: serve a TBL dataset to a PyTorch training loop, where a DataLoader was.

>>> import tbljax.torch
>>> loader = tbljax.torch.loader("train.tbl", batch_size=256, augment="rrc_flip")

torch is imported only when a loader is made (``pip install 'tbljax[torch]'``). The
implementation lives in `tbljax._src.adapters.torch`.
"""

from tbljax._src.adapters.torch import TorchLoader, loader

__all__ = ["TorchLoader", "loader"]
