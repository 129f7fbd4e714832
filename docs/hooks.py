"""mkdocs hooks: the repository's root documents are pages of the site without a copy in
docs/ (one fact, one place), and links written for reading on GitHub resolve in the site.

README.md becomes the home page (`index.md`); its links `docs/x.md` point at `x.md`. A docs
page's link `../AGENTS.md` points at the root document's page.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

# Root document -> its page in the site.
ROOT_PAGES = {
    "README.md": "index.md",
    "EVALUATION_METHODOLOGY.md": "EVALUATION_METHODOLOGY.md",
    "AGENTS.md": "AGENTS.md",
    "SECURITY.md": "SECURITY.md",
}
_FROM_DOCS = re.compile(r"\]\(\.\./(" + "|".join(map(re.escape, ROOT_PAGES)) + r")(?=[#)])")
_FROM_ROOT = re.compile(r"\]\(docs/")


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add each root document to the site under its page name."""
    root = Path(config.config_file_path).parent
    for name, uri in ROOT_PAGES.items():
        files.append(File.generated(config, uri, abs_src_path=str(root / name)))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Rewrite the GitHub-relative links of a page to the site's layout."""
    if page.file.src_uri in ROOT_PAGES.values():
        return _FROM_ROOT.sub("](", markdown)
    return _FROM_DOCS.sub(lambda m: "](" + ROOT_PAGES[m.group(1)], markdown)
