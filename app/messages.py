"""gpcore's messages, worded for the page.

gpcore words its fixes for the Python API and the CLI ("pass lon='x', lat='y'"); on the Data page the
fix is a selector. :func:`for_page` rewrites those phrases to name the selector to change, so the
message and the page agree. One table of rewrites, tested against the readers' real messages.
"""

from __future__ import annotations

import re

_REWRITES: list[tuple[re.Pattern, str]] = [
    (re.compile(r"pass lon='COLUMN' and lat='COLUMN'"), "choose them as Longitude column and Latitude column below"),
    (re.compile(r"pass lon='([^']*)',? (?:and )?lat='([^']*)' to swap them"),
     r"swap them: choose '\1' as Longitude column and '\2' as Latitude column below"),
    (re.compile(r"pass lon='([^']*)',? (?:and )?lat='([^']*)'"),
     r"choose '\1' as Longitude column and '\2' as Latitude column below"),
    (re.compile(r"\(or pass lon=/lat= as they are to keep them\)"),
     "(or choose them as they are in the Longitude / Latitude selectors to keep them)"),
    (re.compile(r"pass lon=/lat= to use other columns"), "choose other Longitude / Latitude columns below"),
    (re.compile(r"pass both lon= and lat=(?: \(got only \w+=[^)]*\))?"),
     "choose both a Longitude column and a Latitude column below"),
    (re.compile(r"pass geometry='COLUMN' for a WKT column"), "use a file with a WKT 'geometry' column"),
    (re.compile(r"pass crs='([^']*)'"), r"reproject the file to lon/lat degrees (EPSG:4326; it looks like \1)"),
    (re.compile(r"pass crs= if the file is projected"), "reproject the file to lon/lat degrees (EPSG:4326)"),
    (re.compile(r"pass sep= with the file's delimiter"), "save the file with commas between columns"),
    (re.compile(r"pass decimal=','"), "save the file with '.' as decimal separator"),
    (re.compile(r"pass layer= to choose"), "save the layer you want as its own file"),
    (re.compile(r"or drop these rows \(Python: allow_drop=True; CLI: [^)]*\)"), "or fix those cells"),
    (re.compile(r",? ?or raise the limit with max_bytes="), ""),
]


def for_page(message: str) -> str:
    """``message`` with API / CLI fixes reworded as the Data page's controls."""
    text = str(message)
    for pattern, repl in _REWRITES:
        text = pattern.sub(repl, text)
    return text
