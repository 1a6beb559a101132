"""Telling someone that a sweep ended: a command, or an e-mail.

``notify_command`` runs once at the end of the sweep with the summary as JSON
on its stdin (see ``SweepSummary.to_dict``). ``notify_email`` sends the
summary through an SMTP server with the standard library's client; the user
name and password come from the environment variables the config names,
never from the config itself.

TLS is verified: ``starttls: true`` (usually port 587) or ``ssl: true``
(implicit TLS, port 465) check the server's certificate and name against the
system's CAs, or against ``ca_file`` for a private CA. Credentials are never
sent over an unencrypted connection unless ``allow_insecure_auth: true`` says
the network is trusted.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import smtplib
import socket
import ssl
import subprocess
from collections.abc import Mapping, Sequence
from email.message import EmailMessage
from typing import Any, Protocol


class SweepSummary(Protocol):
    """What is sent of a sweep's end (``engine/summary.py``'s SweepSummary has it): the engine calls
    these at a sweep's end, and reports/ does not depend on the engine."""

    @property
    def interrupted_by(self) -> str | None: ...

    @property
    def ok(self) -> bool: ...

    def report(self) -> str: ...

    def to_dict(self) -> dict[str, Any]: ...


logger = logging.getLogger("gpu_task_scheduler")
NOTIFY_TIMEOUT = 60.0


def run_notify_command(command: str | Sequence[str], summary: SweepSummary) -> None:
    argv = shlex.split(command) if isinstance(command, str) else list(command)
    try:
        completed = subprocess.run(
            argv,
            input=json.dumps(summary.to_dict()).encode(),
            timeout=NOTIFY_TIMEOUT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        logger.error("notify_command %s failed: %s", argv, error)
        return
    if completed.returncode != 0:
        logger.error(
            "notify_command %s exited with code %d: %s",
            argv,
            completed.returncode,
            completed.stdout.decode("utf-8", "replace")[-2000:],
        )


def send_email(
    settings: Mapping[str, Any],
    summary: SweepSummary,
    *,
    hostname: str = "",
    attachments: Sequence[tuple[str, str, bytes]] = (),
) -> None:
    """Mail the summary; ``attachments``: ``(file name, MIME type, content)`` each (the sweep's
    report, with ``attach_report: true``)."""
    message = EmailMessage()
    counts = summary.to_dict()["counts"]
    state = "interrupted" if summary.interrupted_by else ("done" if summary.ok else "failures")
    message["Subject"] = settings.get("subject") or (
        f"[gts] sweep {state} on {hostname or socket.gethostname()}: {counts['succeeded']} succeeded, "
        f"{counts['failed']} failed, {counts['skipped']} skipped"
    )
    message["From"] = settings["sender"]
    message["To"] = ", ".join(settings["recipients"])
    message.set_content(summary.report())
    for filename, kind, content in attachments:
        main, _, sub = kind.partition("/")
        message.add_attachment(content, maintype=main, subtype=sub, filename=filename)
    host, implicit_tls, starttls = settings["host"], bool(settings.get("ssl")), bool(settings.get("starttls"))
    port = settings.get("port", 465 if implicit_tls else 25)
    user_env, password_env = settings.get("username_env"), settings.get("password_env")
    if (user_env or password_env) and not (implicit_tls or starttls) and not settings.get("allow_insecure_auth"):
        logger.error(
            "notify_email: refusing to send the SMTP password to %s:%s unencrypted; set starttls: true "
            "(port 587) or ssl: true (port 465), or allow_insecure_auth: true for a server on a network "
            "you trust",
            host,
            port,
        )
        return
    try:
        context = ssl.create_default_context(cafile=settings.get("ca_file")) if implicit_tls or starttls else None
        smtp = (
            smtplib.SMTP_SSL(host, port, timeout=NOTIFY_TIMEOUT, context=context)
            if implicit_tls
            else smtplib.SMTP(host, port, timeout=NOTIFY_TIMEOUT)
        )
        with smtp:
            if starttls:
                smtp.starttls(context=context)
            if user_env or password_env:
                user, password = os.environ.get(user_env or ""), os.environ.get(password_env or "")
                if not user or not password:
                    logger.error(
                        "notify_email: %s and %s must both be set in the environment to log in", user_env, password_env
                    )
                    return
                smtp.login(user, password)
            smtp.send_message(message)
    except (OSError, smtplib.SMTPException) as error:  # ssl.SSLError (an unverified certificate) is an OSError
        logger.error("notify_email: could not send the report through %s:%s: %s", host, port, error)
