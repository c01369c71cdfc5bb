"""The web UI and the HTTP APIs, in rooms (ui/<room>/<module>.py; the README's table lists them from the bottom up):
a room per tab (write, plan, compare, library, model, each tab with build() and wire(parts, store)), the HTTP APIs
(api), and the parts the tabs and the APIs share (display, drafts, forms). page.py puts the tabs on one page and
server.py serves it beside the APIs.

Handlers read and write only the store; generation happens in the worker process.
Importing ui first keeps Gradio from rendering its type stubs at import (gradio_stubs.py).
"""

from ui.gradio_stubs import skip_type_stubs

skip_type_stubs()  # before any of ui's modules imports gradio
