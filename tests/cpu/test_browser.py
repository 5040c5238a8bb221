"""The headless-browser helpers (tests/cpu/browser.py) that the report's and the site's tests use:
a served page runs its scripts and fetches from loopback, and a request that would leave the
machine is aborted and recorded."""

from __future__ import annotations

from browser import chromium, page, serve


def test_page_runs_scripts_offline_and_records_what_would_leave_the_machine(tmp_path):
    (tmp_path / "index.html").write_text(
        "<script src='https://cdn.example.invalid/lib.js'></script><p id='x'>before</p>"
        "<script>fetch('data.json').then(r => r.json()).then(j => { x.textContent = j.v; });</script>")
    (tmp_path / "data.json").write_text('{"v": "fetched from loopback"}')
    with chromium() as browser:
        with serve(tmp_path) as base, page(f"{base}/index.html", browser=browser, wait_until="networkidle") as p:
            assert p.inner_text("#x") == "fetched from loopback"
            assert p.blocked == ["https://cdn.example.invalid/lib.js"]
        with page((tmp_path / "index.html").as_uri(), browser=browser) as p:
            assert p.inner_text("#x") == "before"  # file:// pages may not fetch (why serve exists)
            assert p.blocked == ["https://cdn.example.invalid/lib.js"]
