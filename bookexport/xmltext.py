"""What XML (EPUB's XHTML, DOCX's parts) cannot hold."""

from __future__ import annotations

import re

# Characters XML 1.0 forbids (and python-docx rejects); tokenizers occasionally emit them.
_XML_INVALID = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x84\x86-\x9f\ud800-\udfff\ufffe\uffff]")


def xml_safe(text: str) -> str:
    return _XML_INVALID.sub("", text)
