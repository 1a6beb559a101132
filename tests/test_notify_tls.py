"""E-mail reports: certificates are verified, passwords never travel unencrypted."""

import shutil
import socketserver
import ssl
import subprocess
import threading

import pytest
from conftest import _SMTPHandler

from gpu_task_scheduler import GPUTaskScheduler

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command for a test CA")


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    """A self-signed certificate for 127.0.0.1 (its own CA file)."""
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return str(cert), str(key)


class _TLSHandler(_SMTPHandler):
    """The test SMTP server, with STARTTLS (or TLS from the first byte) and a record of what it saw."""

    def setup(self):
        self.refused = False
        if self.server.implicit:
            try:
                self.request = self.server.context.wrap_socket(self.request, server_side=True)
            except (ssl.SSLError, OSError) as error:  # the client did not trust us: what the test wants
                self.server.errors.append(error)
                self.refused = True
        super().setup()

    def handle(self):
        if self.refused:
            return
        try:
            self._serve()
        except (ssl.SSLError, OSError) as error:
            self.server.errors.append(error)

    def _serve(self):
        self.reply("220 localhost test SMTP")
        while True:
            raw = self.rfile.readline()  # not a for loop: STARTTLS replaces rfile mid-session
            if not raw:
                return
            line = raw.decode().rstrip("\r\n")
            verb = line.split(" ")[0].upper()
            if verb == "EHLO":
                self.wfile.write(b"250-localhost\r\n250-STARTTLS\r\n250 AUTH PLAIN\r\n")
            elif verb == "STARTTLS":
                self.reply("220 go ahead")
                self.wfile.flush()
                self.request = self.server.context.wrap_socket(self.request, server_side=True)
                self.rfile, self.wfile = self.request.makefile("rb"), self.request.makefile("wb", buffering=0)
                self.server.encrypted = True
            elif verb == "AUTH":
                self.server.auth.append((line, self.server.encrypted or self.server.implicit))
                self.reply("235 ok")
            elif verb == "DATA":
                self.reply("354 go on")
                for data in self.rfile:
                    if data.rstrip(b"\r\n") == b".":
                        break
                self.server.messages.append("sent")
                self.reply("250 queued")
            elif verb == "QUIT":
                self.reply("221 bye")
                return
            else:
                self.reply("250 ok")


@pytest.fixture(params=["starttls", "ssl"])
def tls_server(request, certificate):
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*certificate)
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _TLSHandler)
    server.daemon_threads = True
    server.context, server.implicit, server.encrypted = context, request.param == "ssl", False
    server.messages, server.auth, server.errors = [], [], []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, request.param
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture(autouse=True)
def _in_tmp(in_tmp):
    return in_tmp


def _send(server, mode, monkeypatch, **extra):
    monkeypatch.setenv("GTS_TEST_SMTP_USER", "alice")
    monkeypatch.setenv("GTS_TEST_SMTP_PASSWORD", "s3cret")
    email = {
        "host": "127.0.0.1",
        "port": server.server_address[1],
        "sender": "gts@example.org",
        "recipients": ["alice@example.org"],
        "username_env": "GTS_TEST_SMTP_USER",
        "password_env": "GTS_TEST_SMTP_PASSWORD",
        **({mode: True} if mode else {}),
        **extra,
    }
    config = {
        "scheduler_config": {"gpu": ["cpu"], "scheduler_log_file_path": None, "notify_email": email},
        "test_config": [{"a": [1]}],
        "command": ["true"],
    }
    GPUTaskScheduler(config).start()


def test_a_self_signed_certificate_is_refused_by_default(tls_server, monkeypatch, caplog):
    server, mode = tls_server
    _send(server, mode, monkeypatch)
    assert server.auth == [] and server.messages == []  # neither the password nor the mail went out
    assert "CERTIFICATE_VERIFY_FAILED" in caplog.text or "certificate verify failed" in caplog.text


def test_a_server_is_trusted_through_its_ca_file(tls_server, certificate, monkeypatch):
    server, mode = tls_server
    _send(server, mode, monkeypatch, ca_file=certificate[0])
    assert server.messages == ["sent"]
    assert [encrypted for _, encrypted in server.auth] == [True]


def test_a_password_is_not_sent_unencrypted_unless_allowed(smtp_server, monkeypatch, caplog):
    _send(smtp_server, None, monkeypatch)
    assert smtp_server.auth == [] and smtp_server.messages == []
    assert "refusing to send the SMTP password" in caplog.text
