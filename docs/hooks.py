"""mkdocs hooks (see mkdocs.yml): the notebooks of `notebooks/` on the site, math as MathML.

The notebooks live at the repository root, where nbmake executes them in the test suite, rather
than in `docs/`: `on_files` adds each `notebooks/*.ipynb` to the site's files as
`notebooks/<name>.ipynb`, before mkdocs-jupyter converts them (it does not execute them: they
are committed with outputs). `on_page_content` renders the TeX of every formula to MathML at
build time (`render_math`), so that pages need no math script and no network.
"""

from __future__ import annotations

import html
import os
import re

from mkdocs.exceptions import PluginError
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@event_priority(100)  # before mkdocs-jupyter's on_files, which picks the notebooks up
def on_files(files: Files, config, **kwargs) -> Files:
    folder = os.path.join(ROOT, "notebooks")
    for name in sorted(os.listdir(folder)):
        if name.endswith(".ipynb"):
            files.append(File(f"notebooks/{name}", ROOT, config["site_dir"], config["use_directory_urls"]))
    return files


# Math: `pymdownx.arithmatex` (generic mode) leaves TeX in `<span class="arithmatex">\(...\)</span>`
# and `<div class="arithmatex">\[...\]</div>`. It is converted here to MathML, which browsers
# render natively: the site shows its formulas with no script and no network. The TeX stays in
# each formula's `<annotation>` (copied with the formula, read by screen readers).
_MATH = re.compile(r'<(span|div) class="arithmatex">(.*?)</\1>', re.S)
_DELIMITERS = {"span": ("\\(", "\\)"), "div": ("\\[", "\\]")}
# MathML Core (what browsers implement) has no named spaces; latex2mathml writes some.
_NAMED_SPACES = {
    "negativeveryverythinmathspace": "-0.0556em",
    "negativeverythinmathspace": "-0.1111em",
    "negativethinmathspace": "-0.1667em",
    "negativemediummathspace": "-0.2222em",
    "negativethickmathspace": "-0.2778em",
    "veryverythinmathspace": "0.0556em",
    "verythinmathspace": "0.1111em",
    "thinmathspace": "0.1667em",
    "mediummathspace": "0.2222em",
    "thickmathspace": "0.2778em",
    "verythickmathspace": "0.3333em",
    "veryverythickmathspace": "0.3889em",
}


def tex_to_mathml(tex: str, *, display: bool) -> str:
    """MathML for one formula's TeX (without delimiters), with the TeX as its annotation."""
    from latex2mathml.converter import convert

    mathml = convert(tex, display="block" if display else "inline")
    unknown = sorted(set(re.findall(r">(\\[A-Za-z]+)<", mathml)))  # latex2mathml keeps them as text
    if unknown:
        raise ValueError(f"unknown TeX command {', '.join(unknown)}")
    mathml = re.sub(r'"(\w+mathspace)"', lambda m: f'"{_NAMED_SPACES.get(m.group(1), m.group(1))}"', mathml)
    head, body = mathml.split(">", 1)
    body = body[: -len("</math>")]
    annotation = f'<annotation encoding="application/x-tex">{html.escape(tex)}</annotation>'
    return f"{head}><semantics>{body}{annotation}</semantics></math>"


def render_math(content: str, where: str) -> str:
    """`content` with each arithmatex formula rendered as MathML."""

    def replace(match: re.Match[str]) -> str:
        tag, tex = match.group(1), html.unescape(match.group(2)).strip()
        opening, closing = _DELIMITERS[tag]
        if not (tex.startswith(opening) and tex.endswith(closing)):
            raise PluginError(f"{where}: unexpected math markup {match.group(0)[:200]!r}")
        tex = tex[len(opening) : -len(closing)].strip()
        try:
            mathml = tex_to_mathml(tex, display=tag == "div")
        except Exception as error:  # noqa: BLE001 (the build fails, naming the formula)
            raise PluginError(f"{where}: cannot render the formula {tex!r} ({error})") from error
        return f'<{tag} class="arithmatex">{mathml}</{tag}>'

    return _MATH.sub(replace, content)


def on_page_content(html_content: str, page, config, files, **kwargs) -> str:
    return render_math(html_content, page.file.src_uri)
