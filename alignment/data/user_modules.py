"""User modules named in argument files (``user_dataset_modules``, reward functions' ``path/to/file.py``): a ``.py``
file or a dotted module name, imported once, so the datasets (or functions) it defines register.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from types import ModuleType
from typing import Iterable

__all__ = ["import_user_module", "import_user_modules"]

_USER_MODULE_PREFIX = "alignment_user_datasets"


def import_user_module(path_or_module: str | os.PathLike, base_dir: str | os.PathLike | None = None) -> ModuleType:
    """Import a user ``.py`` file (path) or dotted module name so its datasets register.

    A relative file path is resolved against ``base_dir`` (e.g. the argument file's
    directory) when given, then the current directory. Importing the same file again
    returns the already-imported module. Raises ``FileNotFoundError`` for a missing file.
    """
    text = os.fspath(path_or_module)
    if not _looks_like_path(text):
        return importlib.import_module(text)
    tried = [os.path.abspath(os.path.join(os.fspath(d), os.path.expanduser(text)))
             for d in dict.fromkeys(d for d in (base_dir, os.getcwd()) if d)]
    file_path = next((path for path in tried if os.path.isfile(path)), None)
    if file_path is None:
        raise FileNotFoundError(f"User dataset module {text!r} not found (looked for {' and '.join(tried)})")
    digest = hashlib.sha1(file_path.encode("utf-8")).hexdigest()[:12]
    module_name = f"{_USER_MODULE_PREFIX}_{_identifier(file_path)}_{digest}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, file_path)
    if spec is None or spec.loader is None:
        raise ImportError(f"Cannot import user dataset module {file_path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


def import_user_modules(paths: Iterable[str | os.PathLike] | str | None,
                        base_dir: str | os.PathLike | None = None) -> list[ModuleType]:
    """:func:`import_user_module` for each entry (e.g. ``user_dataset_modules`` of an argument file)."""
    if paths is None:
        return []
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    return [import_user_module(path, base_dir=base_dir) for path in paths]


def _looks_like_path(text: str) -> bool:
    return text.endswith(".py") or os.sep in text or "/" in text or os.path.isfile(text)


def _identifier(file_path: str) -> str:
    stem = os.path.splitext(os.path.basename(file_path))[0]
    return "".join(char if char.isalnum() else "_" for char in stem) or "module"
