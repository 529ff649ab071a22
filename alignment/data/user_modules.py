"""User dataset modules: a `.py` file or a dotted module name, imported so the datasets it defines register
(`user_dataset_modules`); a module that fails to import is one line naming it."""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any, Callable, Iterable

from alignment.data.errors import DataFormatError, user_code_error

_USER_MODULE_PREFIX = "alignment_user_datasets"


def import_user_module(path_or_module: str | os.PathLike, base_dir: str | os.PathLike | None = None) -> ModuleType:
    """Import a user ``.py`` file (path) or dotted module name so its datasets register.

    A relative file path is resolved against ``base_dir`` (e.g. the argument file's
    directory) when given, then the current directory. Importing the same file again
    returns the already-imported module. Raises ``FileNotFoundError`` for a missing file.
    """
    text = os.fspath(path_or_module)
    if not _looks_like_path(text):
        try:
            return importlib.import_module(text)
        except ModuleNotFoundError as err:
            if err.name and text.startswith(err.name):
                raise DataFormatError(f"user module {text!r} not found (give a .py file or an importable module "
                                      "name)") from None
            raise user_code_error(f"user module {text!r} failed to import", err) from None
        except Exception as err:  # noqa: BLE001 - the module's own code raised: name it, in one line
            raise user_code_error(f"user module {text!r} failed to import", err) from None
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
    except BaseException as err:
        del sys.modules[module_name]
        if isinstance(err, Exception):
            raise user_code_error(f"user module {file_path} failed to import", err) from None
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


def import_function(spec: str, what: str) -> Callable[..., Any]:
    """The function `spec` names, 'module:function' or 'file.py:function'; a ValueError starting with `what` (the
    key or flag that named it) when it cannot be imported or is not a function."""
    target, name = spec.rsplit(":", 1)
    try:
        module = import_user_module(target)
    except (ImportError, FileNotFoundError) as err:
        raise ValueError(f"{what}: cannot import {target!r} ({err})") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"{what}: {target!r} has no function {name!r}")
    return fn
