"""Gradio without its type-stub writer. At import, Gradio 6.31 renders every component class's .pyi stub from the
class's source and compares it with the file beside it in site-packages (gradio.component_meta.create_or_modify_pyi,
there for the authors of custom components): ~2.2 of the 5.5 CPU-s its import took here, in the app's server and in
every process that imports the UI. Nothing reads the stubs at run time.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType

STUB_MODULE = "gradio.component_meta"


class _SkipStubs(importlib.abc.MetaPathFinder):
    """Loads gradio.component_meta as Gradio ships it, then swaps its stub writer out before the first component
    class is made (the metaclasses call it by its module-level name)."""

    def find_spec(self, name: str, path, target=None) -> importlib.machinery.ModuleSpec | None:
        if name != STUB_MODULE:
            return None
        # gradio is a plain package: its own __path__ finds the module without asking this finder again (which stays
        # installed: a reload swaps the writer out again)
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            module.create_or_modify_pyi = write_no_stub

        spec.loader.exec_module = exec_module
        return spec


def write_no_stub(*_args, **_kwargs) -> None:
    """create_or_modify_pyi's stand-in."""


def skip_type_stubs() -> None:
    """Before Gradio's first import in this process (after it, nothing changes)."""
    if STUB_MODULE not in sys.modules and not any(isinstance(f, _SkipStubs) for f in sys.meta_path):
        sys.meta_path.insert(0, _SkipStubs())
