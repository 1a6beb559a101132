"""``gts serve``: the web view's answers, its guards, and the page in a real browser (Chromium,
driven by Playwright; those tests skip, saying why, where no browser can be had)."""

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
from conftest import wait_until

from gpu_task_scheduler.cli.main import main as gts
from gpu_task_scheduler.web.server import make_server

PAYLOAD = "<img src=x onerror=alert(1)>"
WRITER = """import json, os, sys, time
flag, value, out = sys.argv[1], float(sys.argv[2]), sys.argv[3]
print("training with v", value, flush=True)
for step in range(1, 4):
    with open(os.environ["GTS_METRICS_FILE"], "a") as metrics:
        metrics.write(json.dumps({"step": step, "loss": value / step}) + "\\n")
while flag != "-" and not os.path.exists(flag):
    time.sleep(0.05)
json.dump({"loss": value, "val": {"acc": 1 - value}}, open(out + "/result.json", "w"))
"""

# How long a page may take to draw what it was given, in ms: a bound for a hang, never a wait by
# the clock (a CI run on a loaded 2-core machine passed 10 s before the importance page drew).
PAGE_WAIT = 60_000


def make_root(folder, *, values=(0.3, 0.1, 0.2), tags=("a", PAYLOAD), flag="-", slots=2, wait=True, **more):
    """A command sweep over ``v`` x ``tag``; each run reports a loss curve, then (once ``flag``
    exists) writes its result. Returns the root and, when not ``wait``, the running sweep.
    ``more``: top-level config keys to add."""
    (folder / "writer.py").write_text(WRITER)
    config = {
        "scheduler_config": {"gpu": ["cpu"] * slots, "result_root_folder": "results"},
        "command": [sys.executable, str(folder / "writer.py"), flag, "{v}", "{work_dir}"],
        "test_config": [{"v": list(values), "tag": list(tags)}],
        **more,
    }
    (folder / "sweep.json").write_text(json.dumps(config))
    argv = [sys.executable, "-m", "gpu_task_scheduler", "run", "sweep.json", "--plain"]
    if wait:
        assert subprocess.run(argv, cwd=folder, capture_output=True, timeout=120).returncode == 0
        return str(folder / "results"), None
    return str(folder / "results"), subprocess.Popen(
        argv, cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


@pytest.fixture
def served(request):
    """Start a server on a free port for the given roots; returns its URL (stopped at the end)."""
    servers = []

    def start(roots, **options):
        server, url = make_server(roots, port=0, **options)
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()
        servers.append((server, thread))
        return url, server.server_address[1]

    yield start
    for server, thread in servers:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def fetch(url, *, headers=None, method="GET"):
    request = urllib.request.Request(url, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers, error.read()


def at(base, path, **params):
    """``path`` on the server whose URL (as printed, with its token) is ``base``, with the token."""
    token = urllib.parse.parse_qs(urllib.parse.urlsplit(base).query).get("token")
    query = {**params, **({"token": token[0]} if token else {})}
    return base.split("?")[0].rstrip("/") + path + ("?" + urllib.parse.urlencode(query) if query else "")


def api(base, path, **params):
    status, _, body = fetch(at(base, path, **params))
    return status, json.loads(body)


# --- the answers ---------------------------------------------------------------------------------


def test_the_view_pages_sorts_and_filters_the_runs_in_sqlite(in_tmp, served):
    root, _ = make_root(in_tmp)
    url, _ = served([root])
    status, overview = api(url, "/api/overview", root=0)
    assert status == 200 and overview["counts"]["succeeded"] == 6 and overview["scheduler"]["running"] is False
    status, page = api(url, "/api/runs", root=0, sort="loss", limit=4)
    assert status == 200 and page["total"] == 6 and [run["v"] for run in page["runs"]] == [0.1, 0.1, 0.2, 0.2]
    status, page = api(url, "/api/runs", root=0, sort="val.acc", desc=1, offset=4, limit=4)
    assert [run["v"] for run in page["runs"]] == [0.3, 0.3]  # the last page of 6 by accuracy, highest first
    assert page["runs"][0]["result.val.acc"] == pytest.approx(0.7)
    status, page = api(url, "/api/runs", root=0, sort="tag", desc=1, limit=3)  # text: in its order
    assert [run["tag"] for run in page["runs"]] == ["a"] * 3
    status, page = api(url, "/api/runs", root=0, q="tag-a,", status="succeeded")
    assert page["total"] == 3 and all(run["tag"] == "a" for run in page["runs"])
    status, page = api(url, "/api/runs", root=0, status="failed")
    assert page["total"] == 0
    status, page = api(url, "/api/runs", root=0, q='"a"')  # in the parameters' JSON, in no name
    assert page["total"] == 3 and all(run["tag"] == "a" for run in page["runs"])
    name = api(url, "/api/runs", root=0, sort="loss", limit=1)[1]["runs"][0]["name"]
    status, curves = api(url, "/api/curves", root=0, metric="loss", names=name)
    assert curves["runs"][0]["steps"] == [1, 2, 3] and curves["runs"][0]["values"][0] == pytest.approx(0.1)
    status, detail = api(url, "/api/run", root=0, name=name)
    assert detail["config"]["v"] == 0.1 and detail["metrics"]["loss"]["last"] == pytest.approx(0.1 / 3)
    status, pc = api(url, "/api/parcoords", root=0, metric="loss")
    assert sorted(pc["params"]) == ["tag", "v"] and [run["value"] for run in pc["runs"]] == sorted(
        run["value"] for run in pc["runs"]
    )
    for params, code, words in [
        ({"root": 0, "limit": 100000}, 400, "a page holds 0 to 500 runs"),
        ({"root": 0, "status": "nonsense"}, 400, "unknown state 'nonsense'"),
        ({"root": 7}, 404, "no root number 7"),
        ({"root": "x"}, 400, "root must be a whole number"),
    ]:
        status, answer = api(url, "/api/runs", **params)
        assert status == code and words in answer["error"], (params, answer)


def test_no_path_from_a_request_reaches_the_file_system(in_tmp, served):
    root, _ = make_root(in_tmp, values=(0.1,), tags=("a",))
    url, port = served([root])
    (in_tmp / "secret.txt").write_text("TOP-SECRET-CONTENT")
    for name in ("../secret.txt", "/etc/passwd", "..", "v-0.1,/../../secret.txt", str(in_tmp / "secret.txt")):
        for path in ("/api/log", "/api/run", "/api/curves"):
            status, answer = api(url, path, root=0, name=name, names=name, metric="loss")
            assert status == 404 and "TOP-SECRET" not in json.dumps(answer), (path, name, answer)
    for path in ("/static/../setup.py", "/static/%2e%2e/%2e%2e/secret.txt", "/../secret.txt", "/etc/passwd"):
        status, _, body = fetch(at(url, path))
        assert status == 404 and b"TOP-SECRET" not in body, path
    status, _, _ = fetch(url, method="POST")
    assert status == 405
    status, headers, _ = fetch(url)
    assert status == 200 and "script-src 'self'" in headers["Content-Security-Policy"]


def test_another_site_and_other_machines_without_the_token_are_refused(in_tmp, served):
    root, _ = make_root(in_tmp, values=(0.1,), tags=("a",))
    url, port = served([root])
    status, _, _ = fetch(url, headers={"Host": f"attacker.example:{port}"})  # DNS rebinding
    assert status == 403
    assert fetch(url, headers={"Host": f"localhost:{port}"})[0] == 200
    # On a shared machine every user reaches 127.0.0.1: the loopback view asks for the token too.
    assert "?token=" in url and fetch(at(url, "/api/roots").split("?")[0])[0] == 403
    url, port = served([root], no_token=True)
    assert "token" not in url and fetch(at(url, "/api/roots"))[0] == 200
    url, port = served([root], host="0.0.0.0")
    assert "?token=" in url
    token = url.split("token=")[1]
    assert fetch(f"http://127.0.0.1:{port}/api/roots")[0] == 403
    assert fetch(f"http://127.0.0.1:{port}/api/roots?token=wrong")[0] == 403
    status, headers, _ = fetch(f"http://127.0.0.1:{port}/?token={token}")
    assert status == 200 and "Set-Cookie" not in headers  # a cookie would reach every port of the host
    assert fetch(f"http://127.0.0.1:{port}/api/roots", headers={"X-GTS-Token": token})[0] == 200
    assert fetch(f"http://127.0.0.1:{port}/api/roots", headers={"X-GTS-Token": "x" * len(token)})[0] == 403
    assert fetch(f"http://127.0.0.1:{port}/api/roots", headers={"Cookie": f"gts_token={token}"})[0] == 403
    assert fetch(f"http://127.0.0.1:{port}/")[0] == 403  # the page needs it; its code and style hold no data
    assert fetch(f"http://127.0.0.1:{port}/static/app.js")[0] == 200


@pytest.mark.parametrize(
    "args, words",
    [
        (["--token", ""], "got an empty token (an unset variable?)"),
        (["--token", "short"], "at least 16 characters"),
        (["--token", " " + "x" * 20], "without spaces around it"),
        (["--token", "x" * 20, "--no-token"], "give one of them"),
        (["--host", "0.0.0.0", "--no-token"], "--no-token serves this machine only"),
    ],
)
def test_gts_serve_refuses_a_token_anyone_could_guess(in_tmp, capsys, args, words):
    root, _ = make_root(in_tmp, values=(0.1,), tags=("a",))
    assert gts(["serve", root, "--port", "0", *args]) == 2
    assert words in capsys.readouterr().err


def test_gts_serve_refuses_a_folder_that_is_no_result_root(in_tmp, capsys):
    assert gts(["serve", str(in_tmp), "--port", "0"]) == 2
    assert "is not a result root" in capsys.readouterr().err


# --- the page, in a real browser ---------------------------------------------------------------


@pytest.fixture(scope="module")
def chromium():
    """Chromium driven by Playwright (the system's chromium: Playwright's own download is not
    needed), one for the module's tests (each gets a context of its own); they skip, saying why,
    where none can be had. Started before any test's fixtures, so no test's process mark is on it."""
    playwright_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (test extra)")
    executable = os.environ.get("GTS_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if executable is None:
        pytest.skip("no Chromium here (apt-get install chromium, or GTS_CHROMIUM=/path/to/chrome)")
    with playwright_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def browser(chromium):
    """A fresh browser context (its own cookies, storage and pages) for one test."""
    # Playwright evaluates its waits' predicates as strings, which the page's CSP (no eval)
    # forbids: the tests' context lets them through. The page itself never needs eval, and
    # what it shows as text is checked without the CSP's help.
    context = chromium.new_context(bypass_csp=True)
    try:
        yield context
    finally:
        context.close()


def test_the_page_follows_a_live_sweep_and_shows_values_as_text(in_tmp, served, browser, no_leaked_processes):
    flag = in_tmp / "go"
    root, sweep = make_root(in_tmp, values=(0.3, 0.1), tags=("a", PAYLOAD), flag=str(flag), slots=4, wait=False)
    try:
        url, _ = served([root], check=False)  # as gts run --serve: the page waits for the sweep to start
        page = browser.new_page()
        dialogs = []
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
        page.goto(url)
        page.wait_for_function("document.querySelectorAll('#runs tbody tr.running').length === 4", timeout=PAGE_WAIT)
        assert "a scheduler is running" in page.inner_text("#scheduler")
        # The injected value is text in its cell, and nothing ran.
        cells = page.locator("#runs tbody td.tag").all_inner_texts()
        assert PAYLOAD in cells and page.locator("#runs tbody img").count() == 0
        # Sort by v (a header click), keep it; filter; then the runs finish while the page is open.
        page.click("#runs th[data-key=v]")
        page.wait_for_function("document.querySelector('#runs th.sorted')?.dataset.key === 'v'")
        page.fill("#filter", "tag-a,")
        page.wait_for_function("document.querySelectorAll('#runs tbody tr').length === 2")
        flag.write_text("")
        started = time.monotonic()
        page.wait_for_function("document.querySelectorAll('#runs tbody tr.succeeded').length === 2", timeout=PAGE_WAIT)
        assert time.monotonic() - started < 3 + 2  # within 3 s of the runs' ends (+ their own exit)
        assert (
            page.locator("#runs th.sorted").get_attribute("data-key") == "v" and page.input_value("#filter") == "tag-a,"
        )
        assert page.locator("#runs tbody td.v").all_inner_texts() == ["0.1", "0.3"]  # still sorted by v
        # A run's log opens from its name.
        page.locator("#runs tbody td.name a").first.click()
        page.wait_for_function("document.getElementById('run-log').textContent.includes('training with v 0.1')")
        assert page.inner_text("#run-name") == page.locator("#runs tbody td.name").first.inner_text()
        assert dialogs == []
        assert sweep.wait(timeout=60) == 0
    finally:
        if sweep.poll() is None:
            flag.write_text("")
            sweep.wait(timeout=60)


def test_the_token_reaches_no_other_server_on_the_same_host_in_chromium(in_tmp, served, browser):
    """Browsers scope cookies by host, not by port: a token kept in a cookie of 127.0.0.1:A went to
    any server on 127.0.0.1 the user opened. The page keeps it in itself and sends it to its own
    server only; a second server on another port, opened in the same browser, sees none of it."""
    import http.server

    root, _ = make_root(in_tmp, values=(0.1,), tags=("a",))
    url, _ = served([root])
    token = url.split("token=")[1]
    seen = []

    class Other(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            seen.append(str(self.headers))
            body = b"<html><body>another user's server</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Other)
    thread = threading.Thread(target=other.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        page = browser.new_page()
        page.goto(url)
        page.wait_for_function("document.querySelectorAll('#runs tbody tr').length === 1", timeout=PAGE_WAIT)
        assert browser.cookies() == []  # nothing a browser would send elsewhere
        page.goto(f"http://127.0.0.1:{other.server_address[1]}/")
        assert "another user's server" in page.inner_text("body")
        page.goto(f"http://localhost:{other.server_address[1]}/")
        assert len(seen) >= 2 and not any(token in headers for headers in seen), seen
    finally:
        other.shutdown()
        other.server_close()
        thread.join(10)


def test_the_curves_and_parallel_coordinates_draw_one_line_per_run(in_tmp, served, browser):
    root, _ = make_root(in_tmp, values=(0.1, 0.2, 0.3, 0.4, 0.5), tags=("a", "b"))
    url, _ = served([root])
    page = browser.new_page()
    page.set_viewport_size({"width": 1200, "height": 900})
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(url)
    page.wait_for_function("document.querySelectorAll('#runs tbody tr').length === 10")
    assert page.locator("#no-charts").is_hidden()  # Plotly is served from the package (test extra)
    page.fill("#curve-by", "v")
    for box in page.locator("#runs tbody input[type=checkbox]").all():
        box.check()
    page.wait_for_function("document.querySelectorAll('#curves .scatterlayer .trace').length === 10", timeout=PAGE_WAIT)
    page.fill("#pc-metric", "loss")
    page.dispatch_event("#pc-metric", "change")
    page.wait_for_function(
        "document.getElementById('parcoords').data?.[0]?.dimensions?.[0]?.values?.length === 10", timeout=PAGE_WAIT
    )
    assert errors == []
    assert page.screenshot(full_page=True)[:8] == b"\x89PNG\r\n\x1a\n"  # (docs/pictures.py: the docs' picture)


def test_the_page_and_the_report_rank_the_parameters_as_gts_importance_does_and_draw_the_top_two(
    in_tmp, served, browser
):
    from gpu_task_scheduler.reports.importance import importance
    from gpu_task_scheduler.web.report import report_data, write_report

    declared = {"method": "median", "metric": "loss", "mode": "min", "min_runs": 99}  # declares, stops nothing
    root, _ = make_root(in_tmp, values=(0.1, 0.2, 0.3, 0.4), tags=("a", "b", "c"), early_stop=declared)
    url, _ = served([root])
    status, found = api(url, "/api/importance", root=0, metric="loss", mode="min")
    expected = importance(root, "loss", mode="min")
    assert status == 200 and found["parameters"] == expected["parameters"]  # one code path: gts importance's
    assert [p["name"] for p in found["parameters"]] == ["v", "tag"] and found["names"] == ["v", "tag"]
    assert sorted(z for _, z in found["points"]) == sorted([0.1, 0.2, 0.3, 0.4] * 3)
    assert report_data(root)["importance"]["parameters"] == expected["parameters"]
    assert api(url, "/api/importance", root=0, metric="los", mode="min")[1]["problem"].startswith("no run of")
    for address in (url, "file://" + write_report(root, str(in_tmp / "report.html"))):
        page = browser.new_page()
        errors = []
        page.on("pageerror", lambda error: errors.append(str(error)))  # noqa: B023
        page.goto(address)
        page.wait_for_function("document.getElementById('importance').data?.[0]?.y?.length === 2", timeout=PAGE_WAIT)
        page.wait_for_function("document.getElementById('contour').data?.[0]?.type === 'contour'", timeout=PAGE_WAIT)
        page.wait_for_function("document.getElementById('slices').data?.length === 2", timeout=PAGE_WAIT)
        assert "PED-ANOVA on 12 succeeded runs, loss (min)" in page.inner_text("#importance-note")
        # each bar named on its axis (Plotly once left one of two unlabelled)
        labels = [tick.text_content() for tick in page.locator("#importance .yaxislayer-above .ytick text").all()]
        assert sorted(labels) == ["tag", "v"]
        assert errors == []
        page.close()


def test_the_page_and_the_report_draw_the_mean_over_a_parameter_with_the_numbers_gts_plot_uses(in_tmp, served, browser):
    from gpu_task_scheduler.reports.plots import mean_curves
    from gpu_task_scheduler.results import curve_rows, records
    from gpu_task_scheduler.web.report import report_data, write_report

    root, _ = make_root(in_tmp, values=(0.1, 0.2, 0.3), tags=("a", "b"))
    url, _ = served([root])
    names = sorted(record.name for record in records(root))
    status, served_curves = api(url, "/api/curves", root=0, metric="loss", names="\n".join(names), over="tag")
    assert status == 200 and len(served_curves["groups"]) == 3  # v 0.1, 0.2, 0.3; each over tags a and b
    runs = {}
    for row in curve_rows(root):
        runs.setdefault(row["name"], []).append(row)
    expected = mean_curves(runs, {r.name: r.params_value for r in records(root)}, "loss", "tag")
    by_params = lambda groups: sorted(groups, key=lambda g: json.dumps(g["params"], sort_keys=True))  # noqa: E731
    assert by_params(served_curves["groups"]) == by_params(expected)  # the page's numbers are gts plot's
    assert by_params(report_data(root)["groups"]["tag"]["loss"]) == by_params(expected)  # and the report's
    for address in (url, "file://" + write_report(root, str(in_tmp / "report.html"))):
        page = browser.new_page()
        page.set_viewport_size({"width": 1200, "height": 900})
        page.goto(address)
        page.wait_for_function("document.querySelectorAll('#runs tbody tr').length === 6")
        for box in page.locator("#runs tbody input[type=checkbox]").all():
            box.check()
        page.fill("#curve-metric", "loss")
        page.fill("#curve-over", "tag")
        page.dispatch_event("#curve-over", "change")
        # three groups: each a mean line and the two edges of its band
        page.wait_for_function("document.getElementById('curves').data?.length === 9", timeout=PAGE_WAIT)
        means = page.evaluate("document.getElementById('curves').data.filter((t, i) => i % 3 === 2).map(t => t.y)")
        assert sorted(means) == sorted(group["mean"] for group in expected)
        page.close()


def test_the_page_and_the_report_draw_each_members_values_over_the_steps_and_where_it_copied(in_tmp, served, browser):
    """Population-based training: the curves mark where a member went on from another's weights,
    and a chart draws each ticked member's values of the keys PBT changes, step by step."""
    import gts_test_tasks as tasks
    from helpers import make_config

    from gpu_task_scheduler import GPUTaskScheduler
    from gpu_task_scheduler.web.report import write_report

    root = in_tmp / "r"
    config = make_config(root, [{"lr": [1.0, 0.37, 0.14, 0.052]}], slots=("cpu",) * 4)
    config["global_config"] = {"steps": 16, "pause": 0.02}
    config["pbt"] = {"metric": "score", "mode": "max", "interval": 4, "max_step": 16, "perturb": {"lr": [0.5, 2.0]}}
    assert GPUTaskScheduler(config, tasks.ScheduleTask).start().ok
    url, _ = served([str(root)])
    names = [f"lr-{lr}," for lr in (1.0, 0.37, 0.14, 0.052)]
    status, served_curves = api(url, "/api/curves", root=0, metric="score", names="\n".join(names))
    lineages = {run["name"]: run["lineage"] for run in served_curves["runs"]}
    assert status == 200 and all(
        lineages[name][0] == {"step": 0, "values": {"lr": float(name[3:-1])}, "donor": None} for name in names
    )
    jumps = sum(len(lineage) - 1 for lineage in lineages.values())
    assert jumps >= 1  # some member copied another
    for address in (url, "file://" + write_report(str(root), str(in_tmp / "report.html"))):
        page = browser.new_page()
        page.set_viewport_size({"width": 1200, "height": 900})
        page.goto(address)
        page.wait_for_function("document.querySelectorAll('#runs tbody tr').length === 4")
        for box in page.locator("#runs tbody input[type=checkbox]").all():
            box.check()
        page.fill("#curve-metric", "score")
        page.dispatch_event("#curve-metric", "change")
        page.wait_for_function("document.getElementById('schedules').data?.length === 4", timeout=PAGE_WAIT)
        assert page.locator("#schedules").is_visible()
        steps = page.evaluate("document.getElementById('schedules').data.map(t => t.x.length)")
        assert sum(steps) == sum(len(lineage) + 1 for lineage in lineages.values())  # each copy a step of the line
        rings = page.evaluate(
            "document.getElementById('curves').data.filter(t => t.mode === 'markers')"
            ".reduce((n, t) => n + t.x.length, 0)"
        )
        assert rings == jumps
        page.close()


def test_the_runs_table_is_not_built_again_while_nothing_in_it_changes(in_tmp, served, browser):
    """The page asks for the runs every second. Built anew each time, the table took a keyboard user's
    focus every second, and under load a click that came as it was replaced landed on a box the
    page had just made (the markup test below failed so: "clicking the checkbox did not change its
    state"). A sweep that is over keeps its rows, their focus and their ticks."""
    root, _ = make_root(in_tmp)
    url, _ = served([root])
    page = browser.new_page()
    page.goto(url)
    page.wait_for_function("document.querySelectorAll('#runs tbody tr').length === 6")
    page.evaluate("document.querySelector('#runs tbody input').dataset.mark = 'the same element'")
    page.locator("#runs tbody input[type=checkbox]").first.check()
    page.focus("#runs tbody input")
    for _ in range(2):  # two more refreshes of the runs
        with page.expect_response(lambda response: "/api/runs" in response.url, timeout=PAGE_WAIT):
            pass
    assert page.evaluate("document.activeElement.dataset.mark") == "the same element"
    assert page.evaluate("document.querySelector('#runs tbody input').checked") is True


def test_values_that_look_like_markup_are_text_in_every_chart(in_tmp, served, browser):
    """Plotly reads pseudo-HTML in its strings: a value <a href=...> was a live link in a legend and
    <b> made text bold. Every string given to it is escaped, so each shows as the text it is."""
    link, bold = '<a href="https://example.invalid/">link</a>', "<b>bold</b>"
    root, _ = make_root(in_tmp, values=(0.1, 0.2), tags=(link, bold))
    url, _ = served([root])
    page = browser.new_page()
    page.set_viewport_size({"width": 1200, "height": 900})
    page.goto(url)
    page.wait_for_function("document.querySelectorAll('#runs tbody tr').length === 4")
    page.fill("#curve-by", "tag")
    for box in page.locator("#runs tbody input[type=checkbox]").all():
        box.check()
    page.wait_for_function("document.querySelectorAll('#curves .scatterlayer .trace').length === 4", timeout=PAGE_WAIT)
    page.fill("#pc-metric", "loss")
    page.dispatch_event("#pc-metric", "change")
    page.wait_for_function(
        "document.getElementById('parcoords').data?.[0]?.dimensions?.length === 3", timeout=PAGE_WAIT
    )
    page.wait_for_function("document.querySelectorAll('#timeline .trace').length > 0", timeout=PAGE_WAIT)
    charts = "#curves, #parcoords, #timeline"
    assert page.evaluate(f"document.querySelectorAll('{charts.replace(', ', ' a, ')} a').length") == 0
    bold_text = page.evaluate(
        "[...document.querySelectorAll('#curves tspan, #parcoords tspan')].filter(t => (t.getAttribute('style') || '')"
        ".includes('bold')).length"
    )
    assert bold_text == 0
    legend = " ".join(page.locator("#curves .legendtext").all_text_contents())
    assert f"tag={bold}" in legend and f"tag={link}" in legend
    ticks = " ".join(page.locator("#parcoords .tick text").all_text_contents())
    assert bold in ticks and link in ticks


INJECT = """() => {
    const script = document.createElement('script');
    script.textContent = 'window.__ran = (window.__ran || 0) + 1';
    document.body.appendChild(script);
    const handler = 'window.__ran = (window.__ran || 0) + 1';
    document.body.insertAdjacentHTML('beforeend', `<img id=bad src=nosuch onerror="${handler}">`);
    document.getElementById('bad').addEventListener('error', () => { window.__errored = true; });
}"""


def test_the_pages_policy_runs_no_inline_script_even_one_that_reached_the_page(in_tmp, served, browser):
    """Were a value ever to reach the page unescaped, the Content-Security-Policy keeps what it
    injects from running: an inline <script> and an onerror= handler, in Chromium."""
    root, _ = make_root(in_tmp, values=(0.1,), tags=("a",))
    url, _ = served([root])
    ran = {}
    for policy in ("in force", "bypassed"):  # bypassed: the same injection runs, so the test can see it
        context = browser.browser.new_context(bypass_csp=policy == "bypassed")
        try:
            page = context.new_page()
            page.goto(url)
            page.wait_for_selector("#runs tbody tr")
            page.evaluate(INJECT)
            wait_until(lambda page=page: page.evaluate("() => window.__errored === true"), message="the image to fail")
            ran[policy] = page.evaluate("() => window.__ran || 0")
        finally:
            context.close()
    assert ran == {"in force": 0, "bypassed": 2}


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
def test_the_view_is_read_only_for_every_method_that_writes(in_tmp, served, method):
    root, _ = make_root(in_tmp, values=(0.1,), tags=("a",))
    url, _ = served([root])
    status, headers, _ = fetch(at(url, "/api/runs", root=0), method=method)
    assert status == 405 and headers["Allow"] == "GET, HEAD"


def _served_sweep(folder):
    """``gts run --serve 0`` of one run that reports, then waits for the file it returns."""
    flag = folder / "go"
    (folder / "writer.py").write_text(WRITER)
    config = {
        "scheduler_config": {"gpu": ["cpu"], "result_root_folder": "results"},
        "command": [sys.executable, str(folder / "writer.py"), str(flag), "{v}", "{work_dir}"],
        "test_config": [{"v": [0.5]}],
    }
    (folder / "sweep.json").write_text(json.dumps(config))
    argv = [sys.executable, "-m", "gpu_task_scheduler", "run", "sweep.json", "--plain", "--serve", "0"]
    return flag, subprocess.Popen(argv, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_gts_run_serve_serves_the_sweep_while_it_runs(in_tmp, no_leaked_processes):
    """``gts run --serve 0``: the URL is printed before the runs start, and answers while they run."""
    flag, sweep = _served_sweep(in_tmp)
    try:
        line = sweep.stderr.readline()
        assert line.startswith("gts run: watching at http://127.0.0.1:"), line
        url = line.split("watching at ", 1)[1].strip()
        wait_until(lambda: api(url, "/api/overview", root=0)[1].get("counts", {}).get("running") == 1)
        assert api(url, "/api/runs", root=0)[1]["runs"][0]["status"] == "running"
    finally:
        flag.write_text("")
        assert sweep.wait(timeout=60) == 0
        sweep.stderr.close()
        sweep.stdout.close()


def test_gts_run_serve_serves_from_a_process_that_ends_with_a_killed_scheduler(in_tmp, no_leaked_processes):
    """The view of ``gts run --serve`` is another process (its requests cost the scheduler nothing),
    and a kill -9 of the scheduler ends it too: its standard input is the scheduler's pipe."""
    from conftest import marked_pids

    flag, sweep = _served_sweep(in_tmp)
    try:
        url = sweep.stderr.readline().split("watching at ", 1)[1].strip()
        wait_until(lambda: api(url, "/api/overview", root=0)[1].get("counts", {}).get("running") == 1)

        def server_pids():
            found = []
            for pid in marked_pids(no_leaked_processes):
                with open(f"/proc/{pid}/cmdline", "rb") as handle:
                    if b"gpu_task_scheduler.web.server" in handle.read():
                        found.append(pid)
            return found

        assert len(server_pids()) == 1 and server_pids()[0] != sweep.pid
        sweep.kill()
        sweep.wait(timeout=10)
        wait_until(lambda: not server_pids(), timeout=10, message="the view to end with its scheduler")
    finally:
        flag.write_text("")
        sweep.kill()
        sweep.wait(timeout=10)
        sweep.stderr.close()
        sweep.stdout.close()


def test_a_client_that_goes_away_or_stays_idle_costs_no_traceback_and_no_thread(in_tmp, served, capfd, monkeypatch):
    import socket

    from gpu_task_scheduler.web import server as web

    monkeypatch.setattr(web.Handler, "timeout", 0.5)
    monkeypatch.setattr(web, "MAX_CONNECTIONS", 4)
    root, _ = make_root(in_tmp, values=(0.1,), tags=("a",))
    url, port = served([root])
    token = url.split("token=")[1]
    for _ in range(5):  # asks for Plotly (4 MB), then resets the connection before reading it
        client = socket.create_connection(("127.0.0.1", port))
        client.sendall(f"GET /static/plotly.min.js?token={token} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        client.close()
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(8)]  # send nothing
    for client in idle:
        client.settimeout(10)
    # Four are held (then closed after the timeout), the four beyond the cap are closed at once.
    assert all(client.recv(1) == b"" for client in idle)
    for client in idle:
        client.close()
    wait_until(lambda: fetch(at(url, "/api/roots"))[0] == 200)  # and it still answers
    assert "Traceback" not in capfd.readouterr().err


def test_api_answers_are_computed_by_a_few_workers_and_shared(in_tmp, served, monkeypatch):
    """16 pages asking at once for the same slow answer cost one computation of it; different
    answers are computed by at most API_WORKERS requests at a time."""
    from concurrent.futures import ThreadPoolExecutor

    from gpu_task_scheduler.web import data as web_data
    from gpu_task_scheduler.web import server as web

    monkeypatch.setattr(web, "API_WORKERS", 2)
    root, _ = make_root(in_tmp, values=(0.1, 0.2), tags=("a",))
    url, _ = served([root])
    calls, running, most, arrived = [], [0], [0], [0]
    ready = [lambda: arrived[0] >= 16]  # round 1: every request reached the view
    changed = threading.Condition()
    real, real_answer = web_data.parcoords, web.View.answer

    def counted_answer(self, path, query):
        with changed:
            arrived[0] += 1
            changed.notify_all()
        return real_answer(self, path, query)

    def slow_parcoords(*args, **kwargs):
        """A slow aggregate: it ends once the round is ready (the others are asking while it
        computes, or another computes with it), however loaded the machine is."""
        with changed:
            calls.append(args)
            running[0] += 1
            most[0] = max(most[0], running[0])
            changed.notify_all()
            assert changed.wait_for(ready[0], timeout=30), (arrived, most)
            running[0] -= 1
        return real(*args, **kwargs)

    monkeypatch.setattr(web.View, "answer", counted_answer)
    monkeypatch.setattr(web_data, "parcoords", slow_parcoords)
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda _: api(url, "/api/parcoords", root=0, metric="loss"), range(16)))
    assert all(status == 200 for status, _ in answers) and len(calls) == 1
    # round 2: until a second computes at once and every request reached the view (none more may compute)
    ready[0] = lambda: most[0] >= 2 and arrived[0] >= 16 + 8
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: api(url, "/api/parcoords", root=0, metric=f"m{i}"), range(8)))
    assert all(status == 200 for status, _ in answers) and len(calls) == 9 and most[0] == 2


def test_an_override_after_serve_stays_an_override(in_tmp):
    from gpu_task_scheduler.cli.commands.run import _serve_port
    from gpu_task_scheduler.cli.main import build_parser

    for argv, port, overrides in [
        (["run", "s.yaml", "--serve"], 8642, []),
        (["run", "s.yaml", "--serve", "9000"], 9000, []),
        (["run", "s.yaml", "--serve", "lr=0.5"], 8642, ["lr=0.5"]),
        (["run", "s.yaml"], None, []),
    ]:
        args = build_parser().parse_args(argv)
        assert (_serve_port(args), args.overrides) == (port, overrides), argv


def test_a_busy_port_is_answered_with_how_to_choose_another_and_the_default_is_not_rays(in_tmp, capsys):
    import socket

    from gpu_task_scheduler.web.server import DEFAULT_PORT

    assert DEFAULT_PORT not in (8265, 6006, 8888)  # Ray's dashboard, TensorBoard, Jupyter
    root, _ = make_root(in_tmp, values=(0.1,), tags=("a",))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert gts(["serve", str(root), "--port", str(port)]) == 1
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "choose another port with gts serve --port N" in err


def test_the_slots_timeline_and_the_machines_gpus(in_tmp, served, browser, monkeypatch):
    import fake_nvml

    table = in_tmp / "nvml.json"
    monkeypatch.setenv(fake_nvml.ENV, str(table))
    fake_nvml.write_state(str(table), [{"name": "Fake H100 80GB", "total": 80 * 10**9}])
    root, _ = make_root(in_tmp, values=(0.1, 0.2), tags=("a", "b"))
    url, _ = served([root])
    status, timeline = api(url, "/api/timeline", root=0)
    assert (
        status == 200 and len(timeline["runs"]) == 4 and {run["slot"] for run in timeline["runs"]} == {"cpu0", "cpu1"}
    )
    assert all(0 <= run["start"] <= run["end"] for run in timeline["runs"])
    status, report = api(url, "/api/gpus")
    assert status == 200 and [gpu["name"] for gpu in report["gpus"]] == ["Fake H100 80GB"]
    page = browser.new_page()
    page.goto(url)
    page.wait_for_function("document.querySelectorAll('#timeline .bars .point').length === 4", timeout=PAGE_WAIT)
    page.wait_for_function(
        "document.querySelector('#gpus tbody')?.textContent.includes('Fake H100 80GB')", timeout=PAGE_WAIT
    )


def test_a_report_opens_from_a_file_with_no_server_and_no_network(in_tmp, browser, capsys):
    closing = "</script><script>alert(2)</script>"
    root, _ = make_root(in_tmp, values=(0.1, 0.2), tags=(PAYLOAD, closing))
    output = in_tmp / "sweep.html"
    assert gts(["report", root, "-o", str(output)]) == 0 and capsys.readouterr().out.strip() == str(output)
    assert oct(output.stat().st_mode & 0o777) != oct(0o600)  # to share: readable as the umask allows
    page = browser.new_page()
    dialogs, requests, errors = [], [], []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.on("request", lambda request: requests.append(request.url))
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(output.as_uri())
    page.wait_for_function("document.querySelectorAll('#runs tbody tr').length === 4")
    assert sorted(page.locator("#runs tbody td.tag").all_inner_texts()) == sorted([PAYLOAD, closing] * 2)
    assert "4 succeeded" in page.inner_text("#counts")
    page.click("#runs th[data-key='result.loss']")  # sorted in the page
    page.wait_for_function("document.querySelector('#runs th.sorted')?.dataset.key === 'result.loss'")
    assert page.locator("#runs tbody td.v").all_inner_texts() == ["0.1", "0.1", "0.2", "0.2"]
    page.fill("#curve-by", "v")
    for box in page.locator("#runs tbody input[type=checkbox]").all():
        box.check()
    page.wait_for_function("document.querySelectorAll('#curves .scatterlayer .trace').length === 4", timeout=PAGE_WAIT)
    assert dialogs == [] and errors == [] and [url for url in requests if not url.startswith("file:")] == []


def test_the_report_says_what_the_runs_cost(in_tmp, browser, monkeypatch, capsys):
    """GPU-hours and energy, in the overview (as gts status says them) and a column of the runs."""
    import fake_nvml
    import gts_test_tasks as tasks
    from helpers import make_config

    from gpu_task_scheduler import GPUTaskScheduler

    table = in_tmp / "nvml.json"
    monkeypatch.setenv(fake_nvml.ENV, str(table))
    fake_nvml.write_state(str(table), [{"name": "Fake H100 80GB", "total": 80 * 10**9, "power": 300.0}])
    root = in_tmp / "r"
    config = make_config(root, [{"i": [0, 1]}], slots=("0",), global_config={"alloc_gb": 1, "hold": 0.2})
    assert GPUTaskScheduler(config, tasks.FakeGpuTask, nvml=fake_nvml).start().ok
    output = in_tmp / "sweep.html"
    assert gts(["report", str(root), "-o", str(output)]) == 0
    capsys.readouterr()
    page = browser.new_page()
    page.goto(output.as_uri())
    page.wait_for_function("document.querySelectorAll('#runs tbody tr').length === 2")
    cost = page.inner_text("#cost")
    assert cost.startswith("spent: ") and cost.endswith(" kWh") and " GPU-hours, " in cost, cost
    assert page.locator("#runs th[data-key='gpu_hours']").count() == 1
    assert page.locator("#runs th[data-key='energy_kwh']").count() == 1


def test_a_runs_view_in_the_page_and_the_report_says_what_made_it(in_tmp, served, browser):
    from gpu_task_scheduler.web.report import write_report

    root, _ = make_root(in_tmp, values=(0.1,), tags=("a",))
    url, _ = served([root])
    for address in (url, "file://" + write_report(root, str(in_tmp / "report.html"))):
        page = browser.new_page()
        page.goto(address)
        page.wait_for_function("document.querySelectorAll('#runs tbody tr').length === 1")
        page.click("#runs td.name a")
        page.wait_for_function("document.getElementById('run-config').textContent.includes('provenance')")
        shown = json.loads(page.inner_text("#run-config"))["provenance"]
        assert shown["python"].count(".") == 2 and len(shown["packages_sha256"]) == 64 and shown["host"]
        page.close()


def test_the_page_and_the_report_draw_a_searchs_pareto_front_and_mark_it_in_the_table(in_tmp, served, browser):
    pytest.importorskip("optuna")
    from test_objectives import write_sweep

    from gpu_task_scheduler.web.report import write_report

    argv = write_sweep(in_tmp, sampler="random", n_runs=10)
    assert subprocess.run(argv, cwd=in_tmp, capture_output=True, timeout=300).returncode == 0
    root = str(in_tmp / "results")
    url, _ = served([root])
    for address in (url, "file://" + write_report(root, str(in_tmp / "report.html"))):
        page = browser.new_page()
        errors = []
        page.on("pageerror", lambda error: errors.append(str(error)))  # noqa: B023
        page.goto(address)
        page.wait_for_function("document.getElementById('pareto')?.data?.length === 3", timeout=PAGE_WAIT)
        assert page.locator("#pareto-section").is_visible()
        assert page.locator("#runs th[data-key='pareto']").count() == 1
        marked = [cell for cell in page.locator("#runs tbody td.pareto").all_inner_texts() if cell == "front"]
        front = page.evaluate("document.getElementById('pareto').data[2].x.length")
        assert len(marked) == front > 0 and "on the front" in page.inner_text("#pareto-note")
        assert errors == []
        page.close()


def test_the_sweeps_mail_can_attach_its_report(in_tmp, smtp_server):
    import email
    import email.policy

    from gpu_task_scheduler import GPUTaskScheduler

    config = {
        "scheduler_config": {
            "gpu": ["cpu"],
            "scheduler_log_file_path": None,
            "notify_email": {
                "host": "127.0.0.1",
                "port": smtp_server.server_address[1],
                "sender": "gts@example.org",
                "recipients": ["alice@example.org"],
                "attach_report": True,
            },
        },
        "test_config": [{"code": [0, 3]}],
        "command": ["sh", "-c", "exit {code}"],
    }
    GPUTaskScheduler(config).start()
    (raw,) = smtp_server.messages
    parts = list(email.message_from_string(raw, policy=email.policy.default).iter_attachments())
    assert [part.get_filename() for part in parts] == ["sweep.html"]
    html = parts[0].get_payload(decode=True).decode()
    assert '<script type="application/json" id="gts-report">' in html and "code-3," in html


def test_a_metric_with_a_declared_mode_shows_its_best_value(in_tmp, served):
    (in_tmp / "writer.py").write_text(WRITER)
    config = {
        "scheduler_config": {"gpu": ["cpu"], "result_root_folder": "results"},
        "command": [sys.executable, str(in_tmp / "writer.py"), "-", "{v}", "{work_dir}"],
        "test_config": [{"v": [0.3, 0.6]}],
        "early_stop": {"method": "median", "metric": "loss", "mode": "min", "min_runs": 99},
    }
    (in_tmp / "sweep.json").write_text(json.dumps(config))
    assert gts(["run", "sweep.json", "--plain"]) == 0
    url, _ = served([str(in_tmp / "results")])
    runs = api(url, "/api/runs", root=0, sort="metrics.loss.min", desc=1)[1]["runs"]
    assert [round(run["metrics.loss.min"], 6) for run in runs] == [0.2, 0.1]  # v / 3, the lowest reported


def test_no_request_value_makes_the_server_fail(in_tmp, served):
    """Whatever the page's parameters hold (SQL, JSON paths, huge or odd numbers, control
    characters), the answer is 200, 400 or 404: never an error of the server's own."""
    from hypothesis import HealthCheck, example, given, settings
    from hypothesis import strategies as st

    root, _ = make_root(in_tmp, values=(0.1, 0.2), tags=("a",))
    url, _ = served([root])
    text = st.text(min_size=0, max_size=60)
    paths = st.sampled_from(["/api/runs", "/api/run", "/api/log", "/api/curves", "/api/parcoords", "/api/timeline"])

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(
        paths,
        st.dictionaries(
            st.sampled_from(["sort", "desc", "status", "q", "offset", "limit", "name", "names", "metric", "root"]),
            text,
            max_size=5,
        ),
    )
    @example("/api/runs", {"offset": "\u00b2", "limit": "\u0663", "root": "\uff11"})  # digits to str, not to int()
    @example("/api/parcoords", {"metric": '"'})  # a name no JSON path can hold: was a 503 ("bad JSON path")
    @example("/api/runs", {"sort": 'a"b', "desc": "1"})
    def check(path, params):
        status, _, body = fetch(at(url, path, **params))
        assert status in (200, 400, 404), (path, params, body[:300])
        assert isinstance(json.loads(body), dict)

    check()


def test_a_run_that_reported_millions_of_steps_costs_a_view_and_a_report_a_bounded_share(in_tmp, served):
    """A curve of 2 M steps (60 MB) is sampled, not loaded: a request for it answers with at most
    CURVE_POINTS points, from the first step to the last, and a report stays small."""
    from gpu_task_scheduler.records.metrics import CURVE_POINTS

    root, _ = make_root(in_tmp, values=(0.1, 0.2), tags=("a",))
    name = sorted(n for n in os.listdir(root) if n.startswith("tag-"))[0]
    steps = 2_000_000
    with open(os.path.join(root, name, ".gts", "metrics.jsonl"), "w") as handle:
        for start in range(0, steps, 100_000):
            handle.write("".join(f'{{"step": {s}, "loss": {1 / (s + 1)!r}}}\n' for s in range(start, start + 100_000)))
    url, _ = served([root])
    started = time.monotonic()
    status, answer = api(url, "/api/curves", root=0, metric="loss", names=name)
    assert status == 200 and time.monotonic() - started < 10  # whole, it took about a minute and 1 GB
    curve = answer["runs"][0]
    assert 0.9 * CURVE_POINTS <= len(curve["steps"]) <= CURVE_POINTS
    assert curve["steps"][0] < steps / 500 and curve["steps"][-1] == steps - 1
    output = in_tmp / "report.html"
    assert gts(["report", root, "-o", str(output)]) == 0
    assert output.stat().st_size < 8 << 20


TWO_METRICS = """import json, os, sys
value = float(sys.argv[1])
for step in range(1, 4):
    with open(os.environ["GTS_METRICS_FILE"], "a") as metrics:
        metrics.write(json.dumps({"step": step, "loss": value / step, "acc": 1 - value / step}) + "\\n")
"""


def test_a_root_that_declares_no_mode_opens_on_the_first_reported_metric_and_ticks_nothing_as_best(
    in_tmp, served, browser
):
    """Reports of ``loss`` then ``acc``, no mode declared: the page once opened on ``acc`` (the
    ledger sorts metric names) and ticked the five lowest accuracies as the best five."""
    (in_tmp / "two.py").write_text(TWO_METRICS)
    config = {
        "scheduler_config": {"gpu": ["cpu"] * 2, "result_root_folder": "results"},
        "command": [sys.executable, str(in_tmp / "two.py"), "{v}"],
        "test_config": [{"v": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]}],
    }
    (in_tmp / "sweep.json").write_text(json.dumps(config))
    ran = subprocess.run(
        [sys.executable, "-m", "gpu_task_scheduler", "run", "sweep.json", "--plain"], cwd=str(in_tmp), timeout=120
    )
    assert ran.returncode == 0
    url, _ = served([str(in_tmp / "results")])
    page = browser.new_page()
    page.goto(url)
    page.wait_for_function("document.querySelectorAll('#runs tbody tr').length === 7")
    page.wait_for_function("document.getElementById('pc-metric').value !== ''", timeout=PAGE_WAIT)
    assert page.input_value("#pc-metric") == "loss" and page.input_value("#curve-metric") == "loss"
    seen = page.evaluate("state.tick")
    page.wait_for_function(f"state.tick >= {seen + 2}", timeout=PAGE_WAIT)  # two refreshes after the choice
    assert page.locator("#runs tbody input[type=checkbox]:checked").count() == 0


def test_without_webgl_the_page_says_the_parallel_coordinates_need_it(in_tmp, served, browser):
    """Plotly's parallel coordinates draw with WebGL: a browser without it showed an empty box."""
    root, _ = make_root(in_tmp, values=(0.1, 0.2), tags=("a",))
    url, _ = served([root])
    page = browser.new_page()
    page.add_init_script(
        "HTMLCanvasElement.prototype.getContext = ((get) => function (kind, ...rest) {"
        " return kind.includes('webgl') ? null : get.call(this, kind, ...rest); })"
        "(HTMLCanvasElement.prototype.getContext);"
    )
    page.goto(url)
    page.wait_for_function("document.querySelectorAll('#runs tbody tr').length === 2")
    page.fill("#pc-metric", "loss")
    page.dispatch_event("#pc-metric", "change")
    page.wait_for_function("!document.getElementById('parcoords-note').hidden", timeout=PAGE_WAIT)
    assert "need WebGL" in page.inner_text("#parcoords-note")
    normal = browser.new_page()  # where WebGL is there, the note stays hidden and the chart draws
    normal.goto(url)
    normal.wait_for_function("document.querySelectorAll('#runs tbody tr').length === 2")
    normal.fill("#pc-metric", "loss")
    normal.dispatch_event("#pc-metric", "change")
    normal.wait_for_function("document.getElementById('parcoords').data?.[0]?.type === 'parcoords'", timeout=PAGE_WAIT)
    assert normal.locator("#parcoords-note").is_hidden()


def test_runs_the_user_ticks_while_the_best_are_asked_for_stand_alone(in_tmp, served, browser):
    """The page ticks the best runs for a declared metric, once it has asked for them; a run the user
    ticked while that answer was on its way (a loaded machine answers slowly) stands alone: the
    answer adds nothing to it (it added the best, and the user's next click then unticked one)."""
    declared = {"method": "median", "metric": "loss", "mode": "min", "min_runs": 99}  # declares, stops nothing
    root, _ = make_root(in_tmp, values=(0.1, 0.2), tags=("a", "b"), early_stop=declared)
    url, _ = served([root])
    page = browser.new_page()
    held = []
    page.route("**/api/parcoords*", lambda route: held.append(route))  # answered once the user ticked
    page.goto(url)
    page.wait_for_function("document.querySelectorAll('#runs tbody tr').length === 4", timeout=PAGE_WAIT)
    # (each look asks the page something, so that Playwright hears the request meanwhile)
    wait_until(lambda: held or page.evaluate("0"), timeout=60, message="the page to ask for the best runs")
    last = page.locator("#runs tbody input[type=checkbox]").last
    last.check()
    for route in held:
        route.continue_()
    page.unroute("**/api/parcoords*")
    page.wait_for_function("document.querySelectorAll('#curves .scatterlayer .trace').length >= 1", timeout=PAGE_WAIT)
    checked = page.evaluate("[...document.querySelectorAll('#runs tbody input')].map((box) => box.checked)")
    assert checked == [False, False, False, True]
    page.close()
