"""What the bench tests share: the repository's root, and bench/'s scripts loaded as modules
(they are scripts, not a package: each is loaded from its path)."""

import importlib.util
import os
from types import ModuleType

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def script(path: str, name: str) -> ModuleType:
    """The script at `path` (from the repository's root) as a module called `name`."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
