"""ui/gradio_stubs.py: a process that imports the UI makes Gradio's component classes without rendering their .pyi
stubs (~2 CPU-s of every app start)."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO


def test_gradio_is_imported_without_rendering_its_type_stubs():
    """Stock Gradio opens each component's .pyi at import; none may be opened here, whichever of Gradio's functions
    would render them (one renamed, another caller): the swap alone could pass where the seconds came back."""
    script = ("import sys; stubs = []; sys.addaudithook(lambda event, args: event == 'open' and "
              "str(args[0]).endswith('.pyi') and stubs.append(args[0])); "
              "import ui, gradio as gr, gradio.component_meta as meta; gr.Textbox('made'); "
              "print(len(stubs), meta.create_or_modify_pyi is ui.gradio_stubs.write_no_stub)")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "True"]
