"""The documentation's picture of the web view, taken of a real sweep: `python docs/pictures.py`.

From the repository's root, as a new user would: it runs the shipped early-stopping example
(`gts run configs/early_stop.yaml`, no GPU needed: 15 runs of examples/curve_train.py, ASHA stops
the unpromising ones) into results/early_stop, serves that root as `gts serve` does, opens the page
in Chromium (Playwright, with the system's chromium as the tests drive it) as a user opens it, and
writes what it shows to docs/web_view.png. Nothing is chosen for the page: what it shows is what it
opens on (the metric the config declares, the best runs ticked).
"""

import os
import shutil
import subprocess
import sys
import threading

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    from playwright.sync_api import sync_playwright

    from gpu_task_scheduler.web.server import make_server

    os.chdir(REPO)
    root = os.path.join("results", "early_stop")
    shutil.rmtree(root, ignore_errors=True)
    subprocess.run(
        [sys.executable, "-m", "gpu_task_scheduler", "run", "configs/early_stop.yaml", "--plain"], check=True
    )
    server, url = make_server([root], port=0)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    chromium = os.environ.get("GTS_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            # Playwright's waits evaluate their predicates as strings, which the page's CSP (no eval)
            # forbids; the page itself never needs eval.
            context = browser.new_context(bypass_csp=True, viewport={"width": 1280, "height": 900})
            page = context.new_page()
            page.goto(url)
            page.wait_for_function("document.querySelectorAll('#curves .scatterlayer .trace').length > 0")
            page.wait_for_function("document.getElementById('parcoords').data?.[0]?.dimensions?.length > 0")
            page.wait_for_function("document.querySelectorAll('#timeline .bars .point').length > 0")
            output = os.path.join(REPO, "docs", "web_view.png")
            page.screenshot(path=output, full_page=True)
            browser.close()
    finally:
        server.shutdown()
        server.server_close()
    print(output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
