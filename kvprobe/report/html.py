"""DIR/report.html: one self-contained file (plots embedded as data: URIs, no external resource)."""

from __future__ import annotations

import base64
from typing import Any

from jinja2 import Environment
from rich.text import Text

from kvprobe.report.standing import NOT_VERIFIED, SIGNED_HERE, VERIFIED, Standing
from kvprobe.report.summary import candidate_rows, kept_but_broke
from kvprobe.report.tables import all_tables

_TEMPLATE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>kvprobe verdict: {{ v.run.id }}</title>
<style>
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px auto; max-width: 1180px;
       padding: 0 16px; color: #1b1b1b; background: #ffffff; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 18px; margin-top: 32px; border-bottom: 1px solid #ddd; }
.meta { color: #666; font-size: 12px; }
.rec { padding: 12px 16px; border-radius: 6px; margin: 16px 0; font-size: 15px; }
.rec.change { background: #e6f4e6; border-left: 6px solid #2ca02c; }
.rec.keep { background: #fff3e0; border-left: 6px solid #ff9f1c; }
.standing { padding: 6px 12px; border-radius: 6px; margin: 12px 0 0; font-size: 13px; overflow-wrap: anywhere; }
.standing.verified { background: #e6f4e6; } .standing.here { background: #f4f4f4; }
.standing.bad { background: #fde8e8; border-left: 6px solid #d62728; font-weight: 600; }
table { border-collapse: collapse; margin: 8px 0 4px; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f4f4f4; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.tag { display: inline-block; padding: 1px 8px; border-radius: 10px; color: #fff; font-weight: 600; font-size: 12px; }
.t-adopt, .t-pass { background: #2ca02c; } .t-reject, .t-fail { background: #d62728; }
.t-inconclusive { background: #ff9f1c; } .t-no_gain, .t-not_measured { background: #7f7f7f; }
.t-invalid { background: #9467bd; } .t-broken { background: #252525; } .t-reference { background: #1f77b4; }
.note { color: #444; font-size: 12px; margin: 2px 0 12px; }
figure { margin: 12px 0 20px; } figcaption { font-size: 12px; color: #555; }
img.plot { max-width: 100%; border: 1px solid #eee; }
figure.needle { display: inline-block; vertical-align: top; max-width: 48%; margin-right: 1%; }
.absent { color: #888; font-style: italic; }
#glance { display: flex; flex-wrap: wrap; gap: 12px; margin: 8px 0 16px; }
.card { border: 1px solid #ddd; border-radius: 6px; padding: 8px 12px; flex: 1 1 520px; }
.card-head { font-size: 15px; margin-bottom: 4px; }
table.axes { border: none; margin: 0; } table.axes th, table.axes td { border: none; padding: 1px 8px 1px 0; }
table.axes th { background: none; color: #555; font-weight: 600; white-space: nowrap; }
details summary { cursor: pointer; color: #555; font-size: 12px; }
code, pre { background: #f6f6f6; border-radius: 4px; } pre { padding: 8px; overflow-x: auto; font-size: 12px; }
</style></head>
<body>
<h1>kvprobe verdict</h1>
<div class="meta">run {{ v.run.id }} · measured {{ v.run.first_measurement or "-" }}
 to {{ v.run.last_measurement or "-" }} · kvprobe {{ v.run.measured_by or "-" }}
 · schema {{ v.schema }} · rules {{ v.rules }}</div>
<div class="standing {{ standing_class }}" id="standing">{{ standing.line }}</div>
<div class="rec {{ 'change' if v.recommendation.change else 'keep' }}" id="recommendation">
<strong>Recommendation: {{ 'adopt' if v.recommendation.change else 'keep' }} {{ v.recommendation.server }}</strong>
{% if kept_but_broke %}<p><strong>{{ kept_but_broke }}</strong> ({{ v.broken[v.recommendation.server] }})</p>{% endif %}
<details><summary>why</summary>{{ v.recommendation.reason }}</details></div>

<section id="glance">
{% for c in glance %}
<div class="card" data-name="{{ c.name }}"><div class="card-head"><strong>{{ c.name }}</strong>
 <span class="tag t-{{ c.decision }}">{{ c.decision }}</span></div>
<table class="axes"><tbody>
{% for axis, text in c.rows %}<tr><th>{{ axis }}</th><td>{{ text }}</td></tr>
{% endfor %}</tbody></table></div>
{% endfor %}
</section>

{% for t in tables %}
<h2>{{ t.title }}</h2>
<table><thead><tr>{% for h in t.headers %}<th>{{ h }}</th>{% endfor %}</tr></thead><tbody>
{% for row in t.rows %}{% set tag = t.tags[loop.index0] %}<tr>
{% for cell in row %}{% if tag and cell == tag %}<td><span class="tag t-{{ tag }}">{{ cell }}</span></td>
{% else %}<td>{{ cell }}</td>{% endif %}{% endfor %}</tr>
{% endfor %}</tbody></table>
{% if t.note %}<div class="note">{{ t.note }}</div>{% endif %}
{% if t.title in plots_after %}{% for p in plots_after[t.title] %}{{ figure(p) }}{% endfor %}{% endif %}
{% endfor %}

<h2>Plots</h2>
{% for p in plots_rest %}{{ figure(p) }}{% endfor %}

<h2>Signature</h2>
{% set signature = standing.signature %}
{% if signature %}
{% if standing_class == "bad" %}<p>{{ standing.line }}. verdict.json.sig names a key (OpenSSH SSHSIG, namespace
<code>{{ signature.namespace }}</code>) <code id="fingerprint">{{ signature.fingerprint }}</code>: that alone proves
nothing. To check it yourself:</p>
{% else %}<p>Signed (OpenSSH SSHSIG, namespace <code>{{ signature.namespace }}</code>, Ed25519) by
<code id="fingerprint">{{ signature.fingerprint }}</code>. Check that this fingerprint is one you expect, then:</p>
{% endif %}
<pre>echo 'kvprobe-signer namespaces="{{ signature.namespace }}" {{ signature.public_line }}' &gt; allowed_signers
ssh-keygen -Y verify -f allowed_signers -I kvprobe-signer -n {{ signature.namespace }} \\
  -s verdict.json.sig &lt; verdict.json
kvprobe verify . --allowed-signers allowed_signers   # also re-derives every decision</pre>
{% else %}<p class="absent">Not signed.</p>{% endif %}

<div id="plot-status" data-total="{{ n_plots }}" data-loaded="0" data-broken="0"></div>
<div id="layout" data-rects=""></div>
<script>
// Record whether every embedded plot decoded (read by the headless-browser test and visible in the DOM).
window.addEventListener("load", function () {
  var imgs = document.querySelectorAll("img.plot"), ok = 0, bad = 0;
  imgs.forEach(function (img) { if (img.complete && img.naturalWidth > 0) { ok++; } else { bad++; } });
  var s = document.getElementById("plot-status");
  s.setAttribute("data-loaded", ok); s.setAttribute("data-broken", bad);
  // Where the answer landed on screen (read by the screenshot test): the recommendation, each
  // candidate's card and its decision badge, in CSS pixels from the top of the page.
  var rect = function (el) { var r = el.getBoundingClientRect();
    return {x: r.left + window.scrollX, y: r.top + window.scrollY, w: r.width, h: r.height}; };
  var cards = [];
  document.querySelectorAll("#glance .card").forEach(function (card) {
    var tag = card.querySelector(".tag");
    cards.push({name: card.getAttribute("data-name"), decision: tag.textContent, card: rect(card), tag: rect(tag)});
  });
  document.getElementById("layout").setAttribute("data-rects", JSON.stringify(
    {standing: rect(document.getElementById("standing")),
     recommendation: rect(document.getElementById("recommendation")), cards: cards,
     viewport: {w: window.innerWidth, h: window.innerHeight}}));
});
</script>
</body></html>
"""

_FIGURE = """{% macro figure(p) %}<figure class="{{ p.key }}">{% if p.data %}<img class="plot" alt="{{ p.title }}"
 src="data:image/png;base64,{{ p.data }}">{% else %}<p class="absent">{{ p.title }}: {{ p.absent }}</p>{% endif %}
<figcaption>{{ p.title }}</figcaption></figure>{% endmacro %}"""

# Which plot goes under which table; the rest go in the Plots section.
_PLACEMENT = {"capacity": "Decisions", "perplexity": "Perplexity", "load": "Load (mean over repeated runs)",
              "latency": "Load (mean over repeated runs)", "needle": "Needle retrieval"}


def glance(v: dict[str, Any]) -> list[dict[str, Any]]:
    """The first screen: per candidate its decision and the summary's axes, as the terminal says them."""
    out = []
    for name, d in (v.get("decisions") or {}).items():
        rows = [(label, Text.from_markup(text).plain) for label, text in candidate_rows(
            v, name, more="the Power table below")]
        out.append({"name": name, "decision": d["decision"], "rows": rows})
    return out


# The standing's box, by its kind: a verdict that does not verify is the one painted as an alarm.
_STANDING_CLASS = {VERIFIED: "verified", SIGNED_HERE: "here", NOT_VERIFIED: "bad"}


def render(v: dict[str, Any], plots: list[dict[str, Any]], standing: Standing) -> str:
    """`plots`: dicts with key (capacity, perplexity, load, latency, needle), title, png bytes or None,
    and absent (why there is no plot). `standing` is said first, above the recommendation."""
    env = Environment(autoescape=True, trim_blocks=True, lstrip_blocks=True)
    figure = env.from_string(_FIGURE).module.figure  # type: ignore[attr-defined]
    tables = all_tables(v)
    titles = {t.title for t in tables}
    items = [{"key": p["key"], "title": p["title"], "absent": p.get("absent"),
              "data": base64.b64encode(p["png"]).decode() if p.get("png") else None} for p in plots]
    plots_after: dict[str, list[dict[str, Any]]] = {}
    rest = []
    for item in items:
        target = _PLACEMENT.get(item["key"])
        if target in titles:
            plots_after.setdefault(target, []).append(item)
        else:
            rest.append(item)
    return env.from_string(_TEMPLATE).render(
        v=v, tables=tables, glance=glance(v), plots_after=plots_after, plots_rest=rest, figure=figure,
        standing=standing, standing_class=_STANDING_CLASS[standing.kind], n_plots=sum(1 for i in items if i["data"]),
        kept_but_broke=kept_but_broke(v))
