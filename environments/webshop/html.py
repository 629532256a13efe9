"""HTML rendering of a page (Jinja2 with autoescape on: product text and queries can never inject markup).

Every visible string carries `data-obs` and every clickable `data-click="<name>"`; the browser adapter reads
exactly those, which is what makes browser observations equal to text-mode observations.
"""

from __future__ import annotations

import jinja2

from agentgym_opsd.environments.webshop.pages import Page

__all__ = ["render_page", "render_message"]

_ENV = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)

_PAGE = _ENV.from_string("""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>WebShop — {{ page.kind }}</title>
<style>
body{font-family:sans-serif;max-width:60rem;margin:1rem auto;color:#222}
form{display:inline-block;margin:.15rem}
.instruction{background:#f4f4f4;padding:.5rem;margin-bottom:.5rem}
.result-id button{font-family:monospace}.result-title{font-weight:bold}
.option-group{margin-top:.5rem;font-weight:bold}.selected button{background:#ffd27a}
.title{font-size:1.3rem;margin-top:1rem}.buy button{background:#f90;font-weight:bold}
</style></head>
<body><main class="page page-{{ page.kind }}">
{% for seg in page.segments %}
{%- if seg.role == "search-button" %}
<form method="post" action="{{ base }}/search" class="search"><input type="text" name="query" data-search
 aria-label="search query" maxlength="{{ max_query }}"> <button type="submit" data-obs>{{ seg.text }}</button></form>
{%- elif seg.click is not none %}
<form method="post" action="{{ base }}/click" class="click {{ seg.role }}{{ ' selected' if seg.selected else '' }}"
 ><button type="submit" name="name" value="{{ seg.click }}" data-click="{{ seg.click }}" data-obs
 >{{ seg.text }}</button></form>
{%- else %}
<div class="{{ seg.role }}" data-obs>{{ seg.text }}</div>
{%- endif %}
{% endfor %}
{% if page.score is not none %}<div hidden data-score="{{ page.score }}"></div>{% endif %}
</main></body></html>
""")

_MESSAGE = _ENV.from_string("""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>WebShop</title></head>
<body><main><h1>{{ title }}</h1><p>{{ message }}</p>{% if link %}<p><a href="{{ link }}">{{ link_text }}</a></p>{% endif %}
</main></body></html>
""")


_START = _ENV.from_string("""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>WebShop</title></head>
<body><main><h1>WebShop</h1><p>{{ message }}</p>
<form method="post" action="/new" id="start"><input type="hidden" name="split" value="{{ split }}">
<input type="hidden" name="goal" value="{{ goal }}"><button type="submit" id="start-session">start shopping</button></form>
</main></body></html>
""")


def render_start(message: str, split: str, goal: str) -> str:
    """The page that starts a session: a form posting `split` and `goal` to /new (a GET creates nothing)."""
    return _START.render(message=message, split=split, goal=goal)


def render_page(page: Page, base: str, max_query_chars: int) -> str:
    """The page as HTML; `base` is the session's URL prefix that the forms post to."""
    return _PAGE.render(page=page, base=base, max_query=max_query_chars)


def render_message(title: str, message: str, link: str = "", link_text: str = "") -> str:
    return _MESSAGE.render(title=title, message=message, link=link, link_text=link_text)
