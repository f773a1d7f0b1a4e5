"""MkDocs hook: links from the pages to repository files outside docs/.

A page links to a run's table, JSON or plot where it lies, e.g. ``../results/ablation/x.png``
from ``docs/performance.md``: an ordinary relative link that GitHub and an editor follow as it
is. This hook copies every file so linked into the site under ``_repo/`` (``_repo/results/...``)
and points the link there, so ``mkdocs build --strict`` still checks every link, and the site
carries the files it shows. Nothing is fetched; links that leave the repository are left alone.
"""

from __future__ import annotations

import os
import posixpath
import re

from mkdocs.structure.files import File

# ](target) or ](target#anchor) in Markdown links and images.
LINK = re.compile(r"\]\((?P<target>[^)\s#]+)(?P<anchor>#[^)\s]*)?\)")
PREFIX = "_repo"


def _outside_docs(page_uri: str, target: str, docs_dir: str):
    """(path relative to the repository root, absolute path) of a link to a repository file
    outside docs/, else None."""
    if "://" in target or target.startswith(("/", "mailto:")):
        return None
    root = os.path.dirname(docs_dir)
    path = os.path.normpath(os.path.join(docs_dir, os.path.dirname(page_uri), target))
    if path.startswith(docs_dir + os.sep) or not path.startswith(root + os.sep):
        return None
    if not os.path.isfile(path):
        return None
    return os.path.relpath(path, root).replace(os.sep, "/"), path


def on_files(files, config):
    docs_dir = os.path.abspath(config.docs_dir)
    added = set()
    for page in list(files.documentation_pages()):
        if page.abs_src_path is None or not page.abs_src_path.startswith(docs_dir):
            continue
        with open(page.abs_src_path, encoding="utf-8") as f:
            text = f.read()
        for match in LINK.finditer(text):
            hit = _outside_docs(page.src_uri, match.group("target"), docs_dir)
            if hit is None or hit[0] in added:
                continue
            added.add(hit[0])
            files.append(File.generated(config, f"{PREFIX}/{hit[0]}", abs_src_path=hit[1]))
    return files


def on_page_markdown(markdown, page, config, files):
    docs_dir = os.path.abspath(config.docs_dir)
    here = posixpath.dirname(page.file.src_uri)

    def relink(match):
        hit = _outside_docs(page.file.src_uri, match.group("target"), docs_dir)
        if hit is None:
            return match.group(0)
        target = posixpath.relpath(f"{PREFIX}/{hit[0]}", here or ".")
        return f"]({target}{match.group('anchor') or ''})"

    return LINK.sub(relink, markdown)
