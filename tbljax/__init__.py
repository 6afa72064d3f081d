"""tbljax: decode an image dataset once into a TBL file, then serve every epoch to JAX."""
from tbljax._core import CorruptFileError, DecodeError
