"""fieldhmc: Hamiltonian Monte Carlo over the Fourier modes of real 3D fields.

Subpackages are imported on demand (``fieldhmc.ops``, ``fieldhmc.models``,
``fieldhmc.samplers``), so ``import fieldhmc`` stays cheap and does not load
TensorFlow (the CLI validates configs before TensorFlow starts).
"""

__version__ = "0.1.0"
