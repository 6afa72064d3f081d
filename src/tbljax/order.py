"""tbljax.order: which sample sits where — the shuffled order of an epoch as a pure function of
(seed, epoch, position), the steps of an epoch, host parts and the loader's resume state.

>>> tbljax.order.permute(np.arange(4), n=10, seed=0, epoch=0)
"""

from tbljax._src.rules.order import hash32, mix32, permute, random_bits, repeated
from tbljax._src.rules.parts import Parts, advance, steps_in_epoch
from tbljax._src.rules.resume import STATE_VERSION, check_state, make_state

__all__ = [
    "STATE_VERSION",
    "mix32",
    "hash32",
    "permute",
    "random_bits",
    "repeated",
    "steps_in_epoch",
    "advance",
    "Parts",
    "make_state",
    "check_state",
]
