"""HTML (self-contained: inline CSS, figures as data: URIs, no script, no link) and Markdown
(figures as PNG files beside it) from the same sections."""

from __future__ import annotations

import base64
import html

import pandas as pd

from shortcutlab.markdown import md_escape

CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; max-width: 980px; margin: 2em auto;
       padding: 0 1em; color: #222; line-height: 1.45; }
h1 { font-size: 1.6em; } h2 { font-size: 1.25em; border-bottom: 1px solid #ddd; padding-bottom: .2em; margin-top: 2em; }
p.reading { background: #f4f7fb; border-left: 3px solid #4a78b0; padding: .5em .8em; }
p.missing { background: #fbf6ec; border-left: 3px solid #c8962e; padding: .5em .8em; }
img { max-width: 100%; }
table { border-collapse: collapse; font-size: .85em; margin: .8em 0; }
th, td { border: 1px solid #ccc; padding: .25em .5em; text-align: left; vertical-align: top; }
th { background: #f0f0f0; }
ul.notes { font-size: .9em; color: #555; }
code { font-size: .9em; }
"""


def _html_table(frame: pd.DataFrame) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>"
                   for row in frame.itertuples(index=False))
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _md_cell(v) -> str:
    return md_escape(" ".join(str(v).splitlines()))


def _md_table(frame: pd.DataFrame) -> str:
    lines = ["| " + " | ".join(_md_cell(c) for c in frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(_md_cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)


def _html_section(s) -> list[str]:
    parts = [f'<h2 id="{html.escape(s.key)}">{html.escape(s.title)}</h2>']
    if s.png is not None:
        data = base64.b64encode(s.png).decode("ascii")
        parts.append(f'<img alt="{html.escape(s.title)}" src="data:image/png;base64,{data}">')
    if s.missing:
        parts.append(f'<p class="missing">{html.escape(s.missing)}</p>')
    if s.reading:
        parts.append('<p class="reading">' + "<br>".join(html.escape(line) for line in s.reading.split("\n")) + "</p>")
    if s.table is not None and len(s.table):
        parts.append(_html_table(s.table))
    if s.notes:
        parts.append('<ul class="notes">' + "".join(f"<li>{html.escape(n)}</li>" for n in s.notes) + "</ul>")
    return parts


def to_html(title: str, intro: list[str], sections, warnings_: list[str], lead=None) -> str:
    """The report page: the title, the `lead` section (the answer, before anything else), the
    intro paragraphs, a table of contents and the sections."""
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', f"<title>{html.escape(title)}</title>",
             f"<style>{CSS}</style></head><body>", f"<h1>{html.escape(title)}</h1>"]
    if lead is not None:
        parts += _html_section(lead)
    parts += [f"<p>{html.escape(p)}</p>" for p in intro]
    parts.append("<ul>" + "".join(f'<li><a href="#{html.escape(s.key)}">{html.escape(s.title)}</a></li>' for s in sections) + "</ul>")
    for s in sections:
        parts += _html_section(s)
    if warnings_:
        parts.append('<h2 id="warnings">Warnings raised while estimating</h2>')
        parts.append('<ul class="notes">' + "".join(f"<li>{html.escape(w)}</li>" for w in warnings_) + "</ul>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _md_section(s, figure_dir: str) -> list[str]:
    e = md_escape
    lines = [f"## {e(s.title)}", ""]
    if s.png is not None:
        lines += [f"![{e(s.title)}]({figure_dir}/{s.key}.png)", ""]
    if s.missing:
        lines += [f"*{e(s.missing)}*", ""]
    if s.reading:
        lines += ["**Reading.** " + "\n\n".join(e(line) for line in s.reading.split("\n")), ""]
    if s.table is not None and len(s.table):
        lines += [_md_table(s.table), ""]
    for n in s.notes:
        lines.append(f"- {e(' '.join(str(n).splitlines()))}")
    if s.notes:
        lines.append("")
    return lines


def to_markdown(title: str, intro: list[str], sections, warnings_: list[str], figure_dir: str = "figures", lead=None) -> str:
    """`to_html`'s twin, with the figures as files in `figure_dir`."""
    e = md_escape
    lines = [f"# {e(title)}", ""]
    if lead is not None:
        lines += _md_section(lead, figure_dir)
    for p in intro:
        lines += [e(p), ""]
    for s in sections:
        lines += _md_section(s, figure_dir)
    if warnings_:
        lines += ["## Warnings raised while estimating", ""] + [f"- {e(w)}" for w in warnings_] + [""]
    return "\n".join(lines)
