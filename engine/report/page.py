"""The report as one HTML page: inline CSS, inline SVG, inline script, the sample's clips as data
URIs. It asks for nothing over a network, so it opens offline and can be mailed or archived as a
single file. The rows travel as one JSON block that the script turns into the sortable table
(without a script the summary, the histograms and the players still show)."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from pathlib import PurePosixPath

from engine.report.figures import SERIES
from engine.report.read import Output, ReportRow

TEXT_CHARS = 300  # of a row's text kept in the table (a long-form row's whole text would swell the page)
MIME = {".flac": "audio/flac", ".wav": "audio/wav", ".mp3": "audio/mpeg", ".ogg": "audio/ogg"}
# the table's columns: (key, heading, shown only when some row has a value)
COLUMNS = (
    ("id", "id", False), ("text", "text", False), ("status", "status", False), ("duration", "duration s", False),
    ("speaking_rate", "chars/s", False), ("method", "method", False), ("acceptance", "acceptance", False),
    ("cer", "CER", True), ("wer", "WER", True), ("speaker_similarity", "speaker sim.", True),
    ("finish_reason", "finish", False), ("reason", "error / reject reason", False), ("shard", "shard", False),
)

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:14px 24px}header h1{margin:0;font-size:20px}
header p{margin:4px 0 0;color:#b9c1d0}main{padding:8px 24px 40px;max-width:1400px}
section{background:#fff;border:1px solid #dde1e8;border-radius:6px;padding:12px 16px;margin:14px 0}
h2{font-size:16px;margin:0 0 10px}.cards{display:flex;flex-wrap:wrap;gap:10px}
.card{border:1px solid #dde1e8;border-radius:6px;padding:6px 12px;min-width:110px}
.card b{display:block;font-size:18px}.card span{color:#5b6475;font-size:12px}
pre{background:#f1f3f6;padding:8px;overflow-x:auto;font-size:12px}
.hists{display:flex;flex-wrap:wrap;gap:12px}.hist .t{font-size:12px;font-weight:600}
.hist .l{font-size:10px;fill:#5b6475}.hist .axis{stroke:#9aa3b2}
.legend i{display:inline-block;width:10px;height:10px;margin:0 4px 0 12px}
.clips{display:grid;grid-template-columns:repeat(auto-fill,minmax(320px,1fr));gap:10px}
.clip{border:1px solid #dde1e8;border-radius:6px;padding:8px}.clip audio{width:100%}
.clip p{margin:4px 0;font-size:13px}.badge{border-radius:3px;padding:0 5px;font-size:11px;color:#fff}
.ok{background:#3b7dd8}.rejected{background:#e07b39}.error{background:#c23b3b}.cut{background:#7a5cc2}
table{border-collapse:collapse;width:100%;font-size:12px}th,td{border-bottom:1px solid #e6e9ee;padding:3px 6px;
text-align:left;vertical-align:top}th{background:#f1f3f6;cursor:pointer;white-space:nowrap;position:sticky;top:0}
th.asc:after{content:" \\25B2"}th.desc:after{content:" \\25BC"}td.n{text-align:right;font-variant-numeric:tabular-nums}
.controls{margin:6px 0;display:flex;gap:8px;align-items:center;flex-wrap:wrap}.muted{color:#5b6475}
"""

SCRIPT = r"""
(function(){
const data=JSON.parse(document.getElementById('rows-data').textContent);
const idx={}; data.columns.forEach((c,i)=>idx[c.key]=i); const cols=data.columns.filter(c=>!c.hidden);
const PAGE=100;
function cell(r,c){const v=r[idx[c.key]];if(v===null||v===undefined)return '';
 if(typeof v==='number'&&c.num)return v.toFixed(c.key==='duration'?2:3);return String(v);}
function esc(s){return s.replace(/[&<>"]/g,ch=>({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}[ch]));}
function table(el,rows0,opts){
 let key=null,dir=1,page=0,query='',status='';
 const wrap=document.getElementById(el), tbl=wrap.querySelector('table'), info=wrap.querySelector('.info');
 const head=tbl.createTHead().insertRow(), body=tbl.createTBody();
 cols.forEach(c=>{const th=document.createElement('th');th.textContent=c.label;th.dataset.key=c.key;
  th.onclick=()=>{dir=(key===c.key)?-dir:1;key=c.key;page=0;draw();};head.appendChild(th);});
 const q=wrap.querySelector('input.q'), s=wrap.querySelector('select.s');
 if(q)q.oninput=()=>{query=q.value.toLowerCase();page=0;draw();};
 if(s)s.onchange=()=>{status=s.value;page=0;draw();};
 wrap.querySelector('.prev').onclick=()=>{if(page>0){page--;draw();}};
 wrap.querySelector('.next').onclick=()=>{page++;draw();};
 function rows(){let rs=rows0.filter(r=>(!status||r[idx.status]===status||(status==='cut'&&r[idx.cut]))
   &&(!query||[r[idx.id],r[idx.text],r[idx.reason]].some(v=>v&&String(v).toLowerCase().includes(query))));
  if(key!==null){const i=idx[key];rs=rs.slice().sort((a,b)=>{const x=a[i],y=b[i];
   if(x===null||x===undefined)return (y===null||y===undefined)?0:1;if(y===null||y===undefined)return -1;
   return (x<y?-1:x>y?1:0)*dir;});}
  return rs;}
 function draw(){const rs=rows(),pages=Math.max(1,Math.ceil(rs.length/PAGE));page=Math.min(page,pages-1);
  const part=rs.slice(page*PAGE,(page+1)*PAGE);
  body.innerHTML=part.map(r=>'<tr>'+cols.map(c=>{let t=esc(cell(r,c));
   if(c.key==='id'&&r[idx.clip]!==null)t='<a href="#clip-'+r[idx.clip]+'" title="listen">&#9654; '+t+'</a>';
   if(c.key==='status'){t='<span class="badge '+esc(String(r[idx.status]))+'">'+t+'</span>';
    if(r[idx.cut])t+=' <span class="badge cut">cut</span>';}
   return '<td'+(c.num?' class="n"':'')+'>'+t+'</td>';}).join('')+'</tr>').join('');
  tbl.querySelectorAll('th').forEach(th=>th.className=th.dataset.key===key?(dir>0?'asc':'desc'):'');
  info.textContent=rs.length?('rows '+(page*PAGE+1)+'-'+(page*PAGE+part.length)+' of '+rs.length
   +(rs.length<rows0.length?' (filtered from '+rows0.length+')':'')):'no rows';}
 draw();}
table('rows',data.rows);
const bad=data.rows.filter(r=>r[idx.status]!=='ok');
if(document.getElementById('problems'))table('problems',bad);
})();
"""


def _num(v: float | None, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _card(value, label: str) -> str:
    return f'<div class="card"><b>{escape(str(value))}</b><span>{escape(label)}</span></div>'


def summary_section(output, rows: Sequence[ReportRow], summary_text: str | None) -> str:
    """Headline counts (from the rows read) and the job's own summary table."""
    count = {s: sum(r.status == s for r in rows) for s in ("ok", "rejected", "error")}
    audio = sum(r.duration or 0.0 for r in rows if r.status == "ok")
    methods = sorted({r.method for r in rows if r.method})
    accepted = [r.mean_accepted_length for r in rows if r.mean_accepted_length is not None]
    cards = [_card(len(rows), "rows"), _card(count["ok"], "with audio"), _card(count["rejected"], "rejected"),
             _card(count["error"], "error records"), _card(sum(r.cut for r in rows), "cut at the token limit"),
             _card(f"{audio / 3600:.3f} h", f"audio ({audio:.1f} s)"),
             _card(", ".join(methods) or "-", "method")]
    if accepted:
        cards.append(_card(f"{sum(accepted) / len(accepted):.2f}", "mean accepted length (per row)"))
    shards = len(output.committed)
    partial = (f'<p><b>Partial</b>: {shards} of {len(output.planned)} shards are committed; the report covers '
               "those.</p>" if shards < len(output.planned) else "")
    if output.kind == "conversion":
        note = (f'<p class="muted">A conversion ({escape(output.format)}) of '
                f'{escape(str(output.job.get("source")))}; the summary below is its source job\'s.</p>')
    else:
        note = ""
    if summary_text:
        table = ("<details open><summary>The job's summary (summary.json, as <code>pcg-synth run</code> prints it)"
                 f"</summary><pre>{escape(summary_text)}</pre></details>")
    else:
        table = ('<p class="muted">No summary.json: the job has not finished (rerun it to finish; the rows of '
                 "its committed shards are below).</p>")
    return f'<section id="summary"><h2>Summary</h2>{partial}{note}<div class="cards">{"".join(cards)}</div>{table}' \
           "</section>"


def histogram_section(svgs: Sequence[str]) -> str:
    legend = "".join(f'<i style="background:{colour}"></i>{name}' for name, colour in SERIES)
    body = "".join(svgs) or '<p class="muted">No row has audio: nothing to draw.</p>'
    return (f'<section id="histograms"><h2>Distributions</h2><p class="legend muted">rows stacked by status:'
            f"{legend}</p><div class=\"hists\">{body}</div></section>")


def clip_section(sample: Sequence[ReportRow], clips: dict[str, tuple[bytes, str]], size: int, seed: int) -> str:
    cards = []
    for n, row in enumerate(sample):
        if row.id not in clips:
            continue
        data, name = clips[row.id]
        mime = MIME.get(PurePosixPath(name).suffix.lower(), "audio/wav")
        src = f"data:{mime};base64,{base64.b64encode(data).decode()}"
        badges = f'<span class="badge {row.status}">{row.status}</span>' + (
            ' <span class="badge cut">cut</span>' if row.cut else "")
        reason = f"<p>{escape(row.reason)}</p>" if row.reason else ""
        cards.append(
            f'<div class="clip" id="clip-{n}"><p><b>{escape(row.id)}</b> {badges} '
            f'<span class="muted">{row.duration:.2f} s, {_num(row.speaking_rate, 1)} chars/s, acceptance '
            f"{_num(row.acceptance, 2)}</span></p><p>{escape(row.text or '')}</p>{reason}"
            f'<audio controls preload="metadata" data-id="{escape(row.id)}" data-duration="{row.duration}" '
            f'src="{src}"></audio></div>')
    body = "".join(cards) or '<p class="muted">No row has audio to play.</p>'
    return (f'<section id="listen"><h2>Listen</h2><p class="muted">{len(cards)} rows drawn with seed {seed} '
            f"(<code>--sample {size} --seed {seed}</code>): rejects and rows cut at the token limit among them "
            f'where the output has them.</p><div class="clips">{body}</div></section>')


def _table_block(anchor: str, title: str, note: str, filters: bool) -> str:
    controls = ('<input class="q" type="search" placeholder="filter id, text, reason"> '
                '<select class="s"><option value="">every status</option><option>ok</option>'
                '<option>rejected</option><option>error</option><option value="cut">cut</option></select>'
                if filters else "")
    return (f'<section id="{anchor}"><h2>{title}</h2><p class="muted">{note}</p><div class="controls">{controls}'
            '<button class="prev">previous</button><button class="next">next</button><span class="info"></span>'
            "</div><table></table><noscript>The table needs JavaScript.</noscript></section>")


def rows_data(rows: Sequence[ReportRow], sample: Sequence[ReportRow]) -> tuple[str, list[tuple]]:
    """The rows as the table's JSON (safe inside a script element) and the columns shown."""
    shown = [c for c in COLUMNS if not c[2] or any(getattr(r, c[0]) is not None for r in rows)]
    clip_of = {id(r): n for n, r in enumerate(sample)}
    numeric = {"duration", "speaking_rate", "acceptance", "cer", "wer", "speaker_similarity"}
    columns = [{"key": k, "label": label, "num": k in numeric} for k, label, _ in shown]
    columns += [{"key": "cut", "label": "", "hidden": True}, {"key": "clip", "label": "", "hidden": True}]
    out = []
    for r in rows:
        values = []
        for key, _, _ in shown:
            v = r.reason if key == "reason" else getattr(r, key)
            if key == "text" and v and len(v) > TEXT_CHARS:
                v = v[:TEXT_CHARS] + "..."
            values.append(v)
        out.append([*values, r.cut, clip_of.get(id(r))])
    text = json.dumps({"columns": columns, "rows": out}, ensure_ascii=False, separators=(",", ":"))
    # inside a script element no "<" may appear (`</script>`, `<!--`): JSON spells it \u003c
    return text.replace("<", "\\u003c"), shown


@dataclass(frozen=True)
class PageContent:
    """Everything one report page shows.

    Attributes:
        output: the job output read (`engine.report.read.open_output`).
        rows: every row of its committed shards.
        sample: the rows chosen for players (`choose_sample`).
        clips: their audio by row id (rows without audio are absent).
        svgs: the histograms, as inline SVG.
        summary_text: the job's summary, if it wrote one.
        size, seed: the sample asked for and its seed (shown beside the players).
        version: the pcg-synth version writing the page.
    """

    output: Output
    rows: Sequence[ReportRow]
    sample: Sequence[ReportRow]
    clips: dict
    svgs: Sequence[str]
    summary_text: str | None
    size: int
    seed: int
    version: str


def render(page: PageContent) -> str:
    """The whole page."""
    output, rows, sample, clips = page.output, page.rows, page.sample, page.clips
    svgs, summary_text, size, seed, version = page.svgs, page.summary_text, page.size, page.seed, page.version
    data, _ = rows_data(rows, sample)
    bad = sum(r.status != "ok" for r in rows)
    title = f"{output.name}: {len(rows)} rows"
    return "".join([
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width,initial-scale=1">',
        f"<title>{escape(title)} (pcg-synth report)</title><style>{CSS}</style></head><body>",
        f"<header><h1>{escape(output.name)}</h1><p>{escape(output.root)}: {escape(output.format)}"
        f"{' (tarred)' if output.tarred else ''}, {len(output.committed)} shards read; written by pcg-synth "
        f"{escape(version)}</p></header><main>",
        summary_section(output, rows, summary_text),
        histogram_section(svgs),
        clip_section(sample, clips, size, seed),
        _table_block("rows", "Rows", "Click a heading to sort; a row with &#9654; has a player above.", True),
        _table_block("problems", f"Rejects and errors ({bad})",
                     "Rows the quality gate rejected (with why) and error records (with the error).", False)
        if bad else "",
        f'<script type="application/json" id="rows-data">{data}</script>',
        f"<script>{SCRIPT}</script>",
        "</main></body></html>",
    ])
