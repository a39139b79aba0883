"""eaglekit: the tooling between EAGLE-3 training stacks and serving engines.

Heavy dependencies (torch, transformers, triton) are imported only by the modules that compute.
"""

__version__ = "0.1.0"

from eaglekit.errors import EaglekitError  # noqa: E402
from eaglekit.families import load_draft  # noqa: E402

__all__ = ["EaglekitError", "load_draft", "__version__"]
