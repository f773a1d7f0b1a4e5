"""The documentation: README.md and the MkDocs site in docs/ (mkdocs.yml).

The site builds with warnings as errors (``mkdocs build --strict``: broken links, anchors and
nav entries, docstring problems) without fetching anything; every relative link of README.md,
dev/README.md and docs/ resolves (anchors into Markdown pages included); every ``tools/...``,
``dev/tools/...``, ``configs/...`` and ``tests/...`` path a page names exists; the README stays
short (<= 16 KB), with the two commands in its first 40 lines.
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Iterator, List, Set, Tuple

import pytest
from markdown.extensions.toc import slugify

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

# ](target) of a Markdown link or image; src="..." of an HTML image.
LINK = re.compile(r"\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)|<img [^>]*src=\"(?P<src>[^\"]+)\"")
# A repository path a page names: tools/x.py, dev/tools/x.py, configs/small/y.py,
# tests/test_z.py, with shell-style braces and globs (configs/small/*,
# deformable-detr{,-refine}_...).
NAMED_PATH = re.compile(
    r"(?<![\w./$<-])((?:dev/tools|dev/npudet_dev|tools|configs|tests)/[\w.*{},/-]*)"
)
FENCE = re.compile(r"^(```|~~~)")


def pages() -> List[Path]:
    return [README, ROOT / "dev" / "README.md", *sorted(DOCS.rglob("*.md"))]


def links(path: Path) -> Iterator[Tuple[int, str]]:
    in_fence = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line.lstrip()):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        for match in LINK.finditer(line):
            yield number, match.group("target") or match.group("src")


def expand_braces(text: str) -> List[str]:
    match = re.search(r"\{([^{}]*)\}", text)
    if not match:
        return [text]
    head, tail = text[: match.start()], text[match.end() :]
    return [p for alt in match.group(1).split(",") for p in expand_braces(head + alt + tail)]


def test_docs_site_builds_strictly_and_offline(tmp_path):
    site = tmp_path / "site"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "WARNING" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    for page in ("index", "getting-started", "performance", "development", "api/ops"):
        assert (site / f"{page}.html").is_file(), page
    remote = [
        str(p.relative_to(site))
        for p in site.rglob("*.html")
        if re.search(r"fonts\.(googleapis|gstatic)\.com", p.read_text(encoding="utf-8"))
    ]
    assert not remote, f"pages that load remote fonts: {remote}"
    # The API reference holds the generated entries, not only its headings.
    assert "multi_scale_deformable_attn" in (site / "api" / "ops.html").read_text("utf-8")
    # Plots of results/ are shown: the files travel with the site.
    assert list((site / "_repo" / "results").rglob("*.png"))


def anchors(path: Path) -> Set[str]:
    """The anchors of a page's headings, as MkDocs (Python-Markdown's toc) and GitHub make them."""
    found, in_fence = set(), False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line.lstrip()):
            in_fence = not in_fence
        elif not in_fence and line.startswith("#"):
            found.add(slugify(line.lstrip("#").strip().replace("`", ""), "-"))
    return found


def test_every_relative_link_resolves():
    broken = []
    for page in pages():
        for number, link in links(page):
            target, _, anchor = link.partition("#")
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("/"):
                continue
            path = page.parent / target if target else page
            if not path.exists():
                broken.append(f"{page.relative_to(ROOT)}:{number}: {link}")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                broken.append(f"{page.relative_to(ROOT)}:{number}: {link} (no such heading)")
    assert not broken, "broken relative links:\n" + "\n".join(broken)


def test_every_named_tools_configs_tests_path_exists():
    missing = []
    for page in pages():
        text = page.read_text(encoding="utf-8")
        for number, line in enumerate(text.splitlines(), 1):
            for match in NAMED_PATH.finditer(line):
                named = match.group(1).rstrip(".,")
                for path in expand_braces(named):
                    if not glob.glob(str(ROOT / path)):
                        missing.append(f"{page.relative_to(ROOT)}:{number}: {path}")
    assert not missing, "paths named but not in the tree:\n" + "\n".join(missing)


def test_readme_is_short_with_the_two_commands_on_top():
    data = README.read_bytes()
    assert len(data) <= 16 * 1024, f"README.md is {len(data)} bytes (> 16 KB): move text to docs/"
    top = "\n".join(data.decode("utf-8").splitlines()[:40])
    assert "bash tools/main_job.sh" in top and "bash tools/test.sh" in top


@pytest.mark.parametrize(
    "text, expected",
    [
        ("configs/a{,-b}_c.py", ["configs/a_c.py", "configs/a-b_c.py"]),
        ("tools/x.py", ["tools/x.py"]),
    ],
)
def test_expand_braces(text, expected):
    assert expand_braces(text) == expected


@pytest.mark.dev
def test_plot_benchmark_draws_both_json_kinds(tmp_path):
    """dev/tools/plot_benchmark.py, which draws the speed-up plots the Performance page shows."""
    row = {"fwd_x": 2.0, "bwd_x": 0.5, "fwd_bwd_x": 1.2, "queued_x": 1.1, "kernel_x": 3.0}
    rows = [
        {"case": "a", "impl": "grid_sample", **dict.fromkeys(row, 1.0)},
        {"case": "a", "impl": "cpu", **row},
        {"case": "b", "impl": "cpu", **row, "bwd_x": float("nan")},
    ]
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"results": rows}))
    check = tmp_path / "check.json"
    check.write_text(json.dumps({"benchmark": {"rows": rows}}))
    for source, panels in ((bench, []), (check, ["--panels", "fwd_bwd_x,kernel_x"])):
        out = tmp_path / f"{source.stem}.png"
        proc = subprocess.run(
            [
                sys.executable,
                str(ROOT / "dev" / "tools" / "plot_benchmark.py"),
                str(source),
                str(out),
            ]
            + panels,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        assert out.read_bytes().startswith(b"\x89PNG")
