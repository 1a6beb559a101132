"""``gts serve``: a read-only web view of one or more result roots, from the root alone.

The server is the standard library's (``http.server``, a thread per request): the view is
read-only and local, so nothing more is needed, and ``gts serve`` works wherever ``gts`` is
installed. Its charts use Plotly's JavaScript from the ``plotly`` package (``pip install
'gts-sweep[web]'``), served from here: no CDN, so the page works on a cluster node with no
outside access; without it the page shows everything but the charts, and says how to get them.

What it guards against:

* **Other users and other sites.** It binds 127.0.0.1 by default, and asks for a token there
  too (generated and printed in the URL, as Jupyter does, or ``--token``): on a shared GPU
  server every local user can reach 127.0.0.1, and a view shows every run's config, results and
  log. A request without it gets 403. ``--no-token`` turns that off, on a loopback address only.
  A token shorter than 16 characters (an empty one from an unset variable) is refused. The
  token is never put in a cookie: browsers scope cookies by host, not by port, so a cookie of
  127.0.0.1:8765 is sent to every server on 127.0.0.1, and another user's server on another port
  that the user opens would receive it. The page (opened with ``?token=`` in its URL) keeps the
  token in the page itself and sends it with each of its requests (the ``X-GTS-Token`` header,
  which the browser sends to no other server); ``/api/`` answers only with it, or with
  ``?token=`` for a script. The page's own code and style carry no data and are served to
  anyone. The ``Host`` header must name this server (no DNS rebinding: a page of another site
  that resolves its name to 127.0.0.1 gets 403).
* **Paths.** No path from a request reaches the file system: static files are a fixed table,
  and a run's log, config or metrics are found by the run's name in the ledger (records/paths.py
  refuses a name that is not one folder under the root; links and FIFOs are not read). Logs are
  served as a bounded tail.
* **Values.** Every value, run name and log line is data (JSON) that the page writes as text
  (``textContent``), never as HTML; a Content-Security-Policy allows scripts from this server
  only, so an injected ``<script>`` or ``onerror=`` could not run even if it reached the page.
"""

from __future__ import annotations

import errno
import hmac
import http.server
import importlib.resources
import ipaddress
import json
import logging
import math
import os
import secrets
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import ConfigError, GTSError, install_hint
from ..results import open_ledger
from . import data

logger = logging.getLogger("gpu_task_scheduler")

DEFAULT_PORT = 8642  # not Ray's dashboard (8265), TensorBoard's (6006) nor Jupyter's (8888)
TOKEN_HEADER = "X-GTS-Token"  # how the page sends its token with each request (never a cookie)
_STATIC = {  # URL -> (file in this package's static/, content type)
    "/": ("index.html", "text/html; charset=utf-8"),
    "/static/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/static/app.css": ("app.css", "text/css; charset=utf-8"),
}
_PUBLIC = frozenset(("/static/app.js", "/static/app.css", "/static/plotly.min.js", "/favicon.ico"))  # no data
_SECURITY_HEADERS = {
    # Scripts from here only (Plotly's too); Plotly writes its own <style>, hence 'unsafe-inline' for styles.
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
        "connect-src 'self'; font-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def plotly_js() -> bytes | None:
    """Plotly's bundled JavaScript from the installed ``plotly`` package, or None without it."""
    try:
        import plotly
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(plotly.__file__), "package_data", "plotly.min.js")
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


API_WORKERS = 4  # API answers computed at once
API_WAIT = 20.0  # seconds a request waits for a worker before it gets 503
CACHE_SECONDS = 1.0  # an answer is kept at least this long (the page asks every second)
CACHE_ENTRIES = 256  # answers kept


class Busy(Exception):
    """Every worker has been busy for API_WAIT seconds."""


class _Answer:
    __slots__ = ("lock", "value", "expires")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.value: Any = None
        self.expires = 0.0


class View:
    """What one ``gts serve`` shows: its roots, its token, and the answers to the page's requests."""

    def __init__(self, roots: Sequence[str], *, token: str | None, check: bool = True) -> None:
        """``check``: each root must be one now (a ConfigError otherwise); without, a root whose
        sweep has not started yet answers 503 until it has (``gts run --serve``)."""
        for root in roots if check else ():
            open_ledger(root).close()
        self.roots = [os.path.abspath(root) for root in roots]
        self.token = token
        self._plotly: bytes | None = None
        self._plotly_read = False
        self._lock = threading.Lock()
        self._answers: dict[Any, _Answer] = {}
        self._workers = threading.BoundedSemaphore(API_WORKERS)

    def plotly(self) -> bytes | None:
        with self._lock:
            if not self._plotly_read:
                self._plotly, self._plotly_read = plotly_js(), True
            return self._plotly

    def answer(self, path: str, query: dict[str, list[str]]) -> Any:
        """:meth:`api`'s answer, computed by at most API_WORKERS requests at once (the rest wait, up
        to API_WAIT seconds, then get 503) and kept for a while: the page asks for the overview every
        second, and on a root of 200,000 runs it takes seconds. An answer is kept for twice what it
        took, at least CACHE_SECONDS; requests for one answer wait for one computation of it."""
        key = (path, tuple(sorted((name, tuple(values)) for name, values in query.items() if name != "token")))
        with self._lock:
            entry = self._answers.get(key)
            if entry is None:
                entry = self._answers[key] = _Answer()
                while len(self._answers) > CACHE_ENTRIES:
                    del self._answers[next(iter(self._answers))]
        with entry.lock:
            if entry.expires > time.monotonic():
                return entry.value
            if not self._workers.acquire(timeout=API_WAIT):
                raise Busy("the view is busy: try again in a moment")
            try:
                started = time.monotonic()
                value = self.api(path, query)
            finally:
                self._workers.release()
            took = time.monotonic() - started
            entry.value, entry.expires = value, time.monotonic() + max(CACHE_SECONDS, 2 * took)
            return value

    def api(self, path: str, query: dict[str, list[str]]) -> Any:
        """The answer to ``GET /api/...`` (raises NotFound, or ConfigError for a bad value)."""

        def one(name: str, default: str | None = None) -> str:
            values = query.get(name)
            if not values:
                if default is None:
                    raise ConfigError(f"missing parameter {name!r}")
                return default
            return values[-1]

        def number(name: str, default: int) -> int:
            text = one(name, str(default))
            if not (text.isascii() and text.isdigit()) or len(text) > 9:  # '²'.isdigit(), yet int('²') fails
                raise ConfigError(f"{name} must be a whole number; got {text!r}")
            return int(text)

        if path == "/api/roots":
            return {"roots": self.roots, "charts": self.plotly() is not None}
        if path == "/api/gpus":
            return data.gpus()
        index = number("root", 0)
        if index >= len(self.roots):
            raise data.NotFound(f"no root number {index}")
        root = self.roots[index]
        if path == "/api/overview":
            return data.overview(root)
        if path == "/api/runs":
            statuses = [state for state in one("status", "").split(",") if state]
            return data.runs_page(
                root,
                sort=one("sort", "") or None,
                descending=one("desc", "0") == "1",
                statuses=statuses,
                text=one("q", ""),
                offset=number("offset", 0),
                limit=number("limit", 50),
            )
        if path == "/api/run":
            return data.run_detail(root, one("name"))
        if path == "/api/log":
            return data.run_log(root, one("name"))
        if path == "/api/curves":
            names = [name for name in one("names", "").split("\n") if name]
            return data.curves(root, one("metric"), names, one("over", "") or None)
        if path == "/api/timeline":
            return data.timeline(root)
        if path == "/api/parcoords":
            return data.parcoords(root, one("metric"), descending=one("desc", "0") == "1")
        if path == "/api/pareto":
            return data.pareto_view(root)
        if path == "/api/importance":
            mode = one("mode", "min")
            if mode not in ("min", "max"):
                raise ConfigError(f"mode is min or max, not {mode!r}")
            return data.importance(root, one("metric"), mode)
        raise data.NotFound(f"no such page: {path}")


class Handler(http.server.BaseHTTPRequestHandler):
    server_version = "gts"
    sys_version = ""
    timeout = 30  # seconds a connection may stay idle (or a request take to arrive): then it is closed
    view: View  # set on the class made for each server
    allowed_hosts: frozenset[str]

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's name)
        logger.debug("gts serve: %s %s", self.address_string(), format % args)

    def do_HEAD(self) -> None:  # noqa: N802 (http.server's name)
        self.do_GET(body=False)

    def do_POST(self) -> None:  # noqa: N802
        self._send(405, b"read-only\n", "text/plain; charset=utf-8", {"Allow": "GET, HEAD"})

    do_PUT = do_DELETE = do_PATCH = do_POST  # noqa: N815

    def do_GET(self, body: bool = True) -> None:  # noqa: N802
        self._body = body
        parsed = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(parsed.query, keep_blank_values=True)
        host = (self.headers.get("Host") or "").lower()
        if host not in self.allowed_hosts:
            self._send(403, b"this server answers to its own address only\n", "text/plain; charset=utf-8")
            return
        path = parsed.path
        # The page's own code and style hold no data: served to anyone. The page itself and every
        # answer need the token (the page reads it from its URL and sends it with each request).
        if self.view.token is not None and path not in _PUBLIC:
            given = query["token"][-1] if query.get("token") else self.headers.get(TOKEN_HEADER)
            if given is None or not hmac.compare_digest(given.encode(), self.view.token.encode()):
                self._send(403, b"a token is needed: open the URL gts serve printed\n", "text/plain; charset=utf-8")
                return
        try:
            if path in _STATIC:
                name, kind = _STATIC[path]
                content = importlib.resources.files(__package__).joinpath("static").joinpath(name).read_bytes()
                self._send(200, content, kind)
            elif path == "/static/plotly.min.js":
                script = self.view.plotly()
                if script is None:
                    self._send(404, f"{install_hint('web')} for charts\n".encode(), "text/plain; charset=utf-8")
                else:
                    self._send(200, script, "text/javascript; charset=utf-8", {"Cache-Control": "max-age=86400"})
            elif path == "/favicon.ico":
                self._send(204, b"", "image/x-icon")
            elif path.startswith("/api/"):
                self._json(200, self.view.answer(path, query))
            else:
                self._send(404, b"not found\n", "text/plain; charset=utf-8")
        except data.NotFound as error:
            self._json(404, {"error": str(error)})
        except ConfigError as error:
            self._json(400, {"error": str(error)})
        except (GTSError, Busy) as error:  # the ledger cannot be read now (a sweep starting, a damaged file)
            self._json(503, {"error": str(error)})

    def _json(self, code: int, value: Any) -> None:
        text = json.dumps(_finite(value), default=str, allow_nan=False, separators=(",", ":"))
        self._send(code, text.encode(), "application/json")

    def _send(self, code: int, content: bytes, kind: str, more: dict[str, str] | None = None) -> None:
        self.send_response(code)
        headers = {**_SECURITY_HEADERS, "Content-Type": kind, "Content-Length": str(len(content)), **(more or {})}
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if self._body:
            self.wfile.write(content)

    _body = True


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity: they become null (a run's result may hold them)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


MAX_CONNECTIONS = 64  # open at once; more are closed as they come (each holds a thread)


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._open = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._open.acquire(blocking=False):
            self.shutdown_request(request)  # too many open at once: this one is closed
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._open.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._open.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        error = sys.exc_info()[1]
        if isinstance(error, (ConnectionError, TimeoutError)):  # the client went away, or went quiet
            logger.debug("gts serve: %s: %s", client_address, error)
            return
        logger.error("gts serve: a request from %s failed", client_address, exc_info=True)


def make_server(
    roots: Sequence[str],
    *,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    token: str | None = None,
    no_token: bool = False,
    check: bool = True,
) -> tuple[Server, str]:
    """The server (not started) and the URL to open. A token is made unless one is given, or
    ``no_token`` (a loopback address only). ``check``: see :class:`View`."""
    token = _checked_token(token, no_token, host)
    view = View(roots, token=token, check=check)
    handler: type[Handler] = type("BoundHandler", (Handler,), {"view": view})
    try:
        server = Server((host, port), handler)
    except OSError as error:
        message = f"cannot listen on {host}:{port}: {error.strerror or error}"
        if error.errno == errno.EADDRINUSE:
            message += (
                " (another gts serve, or another program, has it): choose another port with gts serve --port N "
                "or gts run --serve N (0 takes any free one)"
            )
        raise GTSError(message) from error
    bound = server.server_address[1]
    names = {host.lower(), "localhost", "127.0.0.1", "::1"} if is_loopback(host) else {host.lower()}
    if host in ("0.0.0.0", "::"):  # any address of this machine: the names it may be reached by
        import socket

        names |= {socket.gethostname().lower(), socket.getfqdn().lower(), "localhost", "127.0.0.1"}
        try:
            names |= {str(address[4][0]) for address in socket.getaddrinfo(socket.gethostname(), None)}
        except OSError:
            pass
    handler.allowed_hosts = frozenset(f"[{name}]:{bound}" if ":" in name else f"{name}:{bound}" for name in names)
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    url = f"http://{shown}:{bound}/" + (f"?token={token}" if token else "")
    return server, url


MIN_TOKEN_CHARS = 16


def _checked_token(token: str | None, no_token: bool, host: str) -> str | None:
    if no_token:
        if token is not None:
            raise ConfigError("--token and --no-token: give one of them")
        if not is_loopback(host):
            raise ConfigError(
                f"--no-token serves this machine only (a loopback --host such as 127.0.0.1); --host {host} "
                "would let anyone who reaches it read every run"
            )
        return None
    if token is None:
        return secrets.token_urlsafe(24)
    if len(token) < MIN_TOKEN_CHARS or token.strip() != token:
        shown = "an empty token (an unset variable?)" if not token else f"a token of {len(token)} characters"
        raise ConfigError(
            f"--token must be at least {MIN_TOKEN_CHARS} characters, without spaces around it; got {shown}. "
            "Leave it out and one is made"
        )
    return token


def serve(
    roots: Sequence[str],
    *,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    token: str | None = None,
    no_token: bool = False,
    say: Callable[[str], Any] = print,
) -> None:
    """Serve until interrupted (Ctrl-C)."""
    server, url = make_server(roots, host=host, port=port, token=token, no_token=no_token)
    say(f"gts serve: {url}  (Ctrl-C to stop)")
    sys.stdout.flush()
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()


class Serving:
    """``gts serve`` of a sweep's root in a process of its own for as long as a ``with`` block
    (``gts run --serve``). Its requests cost the scheduler nothing: in a thread of the scheduler's
    process they shared its interpreter (six pages polling made a 150-run sweep 2.9x slower), and
    a slow request held up the loop. It ends with the block, or with the scheduler however that
    ends: its standard input is a pipe from the scheduler, and it stops at the pipe's end."""

    def __init__(self, roots: Sequence[str], *, port: int) -> None:
        import subprocess

        # As the runner is started (backends/local/prepare.py): also where this package is not
        # installed but only importable from the scheduler's sys.path.
        parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
        boot = (
            f"import sys; sys.path.append({parent!r}); "
            "from gpu_task_scheduler.web.server import serve_for_scheduler; sys.exit(serve_for_scheduler(sys.argv[1:]))"
        )
        argv = [sys.executable, "-c", boot, str(port), *[os.path.abspath(root) for root in roots]]
        # A session of its own: Ctrl-C reaches the scheduler, which then closes the pipe.
        self._process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True, close_fds=True
        )
        assert self._process.stdout is not None
        self.url = self._process.stdout.readline().decode("utf-8", "replace").strip()
        if not self.url:  # it said why on its standard error, which is ours
            self._process.wait()
            raise GTSError(f"--serve: the web view could not start (exit code {self._process.returncode})")

    def __enter__(self) -> Serving:
        return self

    def __exit__(self, *exc: object) -> None:
        import subprocess

        assert self._process.stdin is not None and self._process.stdout is not None
        self._process.stdin.close()
        self._process.stdout.close()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


def serve_for_scheduler(argv: list[str]) -> int:
    """The process of :class:`Serving` (``argv``: PORT ROOT...): prints its URL, then serves until
    its standard input ends."""
    try:
        server, url = make_server(argv[1:], port=int(argv[0]), check=False)
    except GTSError as error:
        print(f"gts run --serve: {error}", file=sys.stderr, flush=True)
        return 1

    def watch() -> None:
        sys.stdin.buffer.read()  # returns at the pipe's end: the scheduler ended
        server.shutdown()

    threading.Thread(target=watch, name="gts-serve-parent", daemon=True).start()
    print(url, flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
    return 0
