"""``shell: true`` templates: placeholders the shell can never execute.

Quoting a value for the shell only works if we know the quoting context the
template puts it in: ``shlex.quote`` is right for ``echo {v}`` and wrong for
``echo "{v}"`` or ``echo '{v}'``, where its quotes close the template's and a
``$(...)`` in the value runs. So no value is written into the script at all.
Each placeholder becomes a reference to an environment variable
(``GTS_ARG_0``, ``GTS_ARG_1``, ...) that holds the formatted value, and the
shell expands the reference; a parameter expansion's result is never parsed
as shell code again, whatever it contains.

The scanner below follows POSIX sh quoting far enough to write the reference
that gives the value as *one word* in each context:

==========================  =====================  ===========================
context                     example                reference
==========================  =====================  ===========================
unquoted, ``$(...)``, `` `` ``  ``echo {v}``          ``"${GTS_ARG_0}"``
double quotes               ``echo "a-{v}"``       ``${GTS_ARG_0}``
single quotes               ``echo 'a-{v}'``       ``'"${GTS_ARG_0}"'`` (closes, reopens)
``$'...'``                  ``echo $'a-{v}'``      ``'"${GTS_ARG_0}"$'``
here-document body          ``cat <<EOF``          ``${GTS_ARG_0}``
==========================  =====================  ===========================

Contexts where the shell would *evaluate* the text (arithmetic ``$((...))``,
inside ``${...}``), where it expands nothing (a here-document with a quoted
delimiter) or where the reference itself would be escaped (right after a
backslash) are refused with a :class:`ConfigError` before anything runs.
Even if this scanner misreads an exotic template, the worst outcome is a
wrong word, never an executed value: the value is not in the script.

What this does not and cannot do: a *command* that runs its arguments as code
(``eval``, ``trap``, ``sh -c``, ``python -c``, ``ssh``) runs the value it is
given, as it would any word; the README states this rule. Telling such
commands apart would need the shell's whole grammar (aliases, functions,
``command eval``, a variable holding ``eval``) and would still be a guess.
"""

from __future__ import annotations

from ..errors import ConfigError
from ..recordclass import Record
from ..recordclass import field as record_field
from .templates import parse

ENV_PREFIX = "GTS_ARG_"
_PLAIN = ("plain", "cmdsub", "backtick", "paren")
_WORD_BREAK = " \t\n;&|()<>"
_EVALUATED = {
    "arith": "an arithmetic expansion $((...))",
    "aparen": "an arithmetic expansion $((...))",
    "param": "a parameter expansion ${...}",
}


class ShellTemplate(Record):
    script: str
    # environment variable -> (field name, format spec, conversion)
    fields: dict[str, tuple[str, str, str | None]] = record_field(default_factory=dict)


def compile_shell_template(template: str) -> ShellTemplate:
    """The script with references in place of placeholders, and what each holds.

    >>> compile_shell_template("echo '{v}' \\"{w:.1f}\\" {v!r}").script
    'echo \\'\\'"${GTS_ARG_0}"\\'\\' "${GTS_ARG_1}" "${GTS_ARG_2}"'
    """
    pieces = parse(template)
    scanner = _Scanner()
    out: list[str] = []
    fields: dict[str, tuple[str, str, str | None]] = {}
    for literal, field, spec, conversion in pieces:
        scanner.feed(literal)
        out.append(literal)
        if field is None:
            continue
        if spec and "{" in spec:
            raise ConfigError(
                f"command {template!r}: nested placeholders in a format spec ({{{field}:{spec}}}) "
                "are not supported with shell: true"
            )
        variable = f"{ENV_PREFIX}{len(fields)}"
        out.append(scanner.reference(variable, field, template))
        fields[variable] = (field, spec or "", conversion)
    return ShellTemplate("".join(out), fields)


class _Scanner:
    """Tracks the shell's quoting context across the template's literal text."""

    def __init__(self) -> None:
        self.stack = ["plain"]
        self.escaped = False  # a backslash ended the last literal: it escapes what follows
        self.word_start = True
        self.comment = False
        self.pending: list[tuple[str, bool, bool]] = []  # here-documents announced on this line
        self.heredoc: tuple[str, bool, bool] | None = None  # (delimiter, quoted, strip tabs)
        self.line = ""
        self.line_has_field = False
        self.delimiter_open = False  # a ``<<`` whose delimiter word runs into a placeholder

    def reference(self, variable: str, field: str, template: str) -> str:
        context = self.stack[-1]

        def refuse(where: str) -> ConfigError:
            return ConfigError(
                f"command {template!r}: the placeholder {{{field}}} sits {where}; "
                "move it outside (e.g. into a shell variable first: v={" + field + "}; ...)"
            )

        if self.escaped:
            raise refuse("right after a backslash, which would escape it")
        if self.delimiter_open:
            raise refuse("in a here-document's delimiter")
        self.word_start = False
        self.line_has_field = True
        if self.heredoc is not None:
            if self.heredoc[1]:
                raise refuse("in a here-document with a quoted delimiter, where the shell expands nothing")
            return f"${{{variable}}}"
        if self.comment:
            return f"${{{variable}}}"
        if context in _EVALUATED:
            raise refuse(f"inside {_EVALUATED[context]}, where the shell would evaluate the value")
        if context == "dq":
            return f"${{{variable}}}"
        if context == "sq":
            return f"'\"${{{variable}}}\"'"
        if context == "dsq":
            return f"'\"${{{variable}}}\"$'"
        return f'"${{{variable}}}"'

    def feed(self, text: str) -> None:
        if text:
            self.escaped = False
            self.delimiter_open = False
        i = 0
        while i < len(text):
            i = self._step(text, i)

    def _newline(self) -> None:
        if self.heredoc is not None:
            delimiter, _, strip_tabs = self.heredoc
            line = self.line.lstrip("\t") if strip_tabs else self.line
            if not self.line_has_field and line == delimiter:
                self.heredoc = self.pending.pop(0) if self.pending else None
        elif self.pending and self.stack[-1] in _PLAIN:
            self.heredoc = self.pending.pop(0)
        self.line = ""
        self.line_has_field = False
        self.comment = False
        self.word_start = True

    def _step(self, text: str, i: int) -> int:
        c = text[i]
        if c == "\n":
            self._newline()
            return i + 1
        self.line += c
        if self.heredoc is not None or self.comment:
            return i + 1
        context = self.stack[-1]
        ahead = text[i + 1 : i + 3]
        at_word_start = self.word_start
        if context in _PLAIN:
            self.word_start = c in _WORD_BREAK
        if context == "sq":
            if c == "'":
                self.stack.pop()
            return i + 1
        if c == "\\" and context != "sq":
            if i + 1 == len(text):
                self.escaped = True
                return i + 1
            self.line += text[i + 1]
            return i + 2
        if context == "dsq":
            if c == "'":
                self.stack.pop()
            return i + 1
        if c == "$":
            if ahead.startswith("(("):
                self.stack.append("arith")
                self.line += ahead
                return i + 3
            opened = {"(": "cmdsub", "{": "param", "'": "dsq" if context in _PLAIN else None}.get(ahead[:1])
            if opened:
                self.stack.append(opened)
                self.line += ahead[:1]
                self.word_start = opened == "cmdsub"
                return i + 2
            return i + 1
        if c == "`":
            if context == "backtick":
                self.stack.pop()
            else:
                self.stack.append("backtick")
                self.word_start = True
            return i + 1
        if context == "dq":
            if c == '"':
                self.stack.pop()
            return i + 1
        if context == "param":
            if c == "}":
                self.stack.pop()
            elif c == '"':
                self.stack.append("dq")
            return i + 1
        if context in ("arith", "aparen"):
            if c == "(":
                self.stack.append("aparen")
            elif c == ")" and context == "aparen":
                self.stack.pop()
            elif c == ")" and ahead[:1] == ")":
                self.stack.pop()
                self.line += ")"
                return i + 2
            return i + 1
        return self._step_plain(text, i, c, context, at_word_start)

    def _step_plain(self, text: str, i: int, c: str, context: str, at_word_start: bool) -> int:
        if c == "'":
            self.stack.append("sq")
        elif c == '"':
            self.stack.append("dq")
        elif c == "(":
            self.stack.append("paren")
        elif c == ")" and context in ("cmdsub", "paren"):
            self.stack.pop()
        elif c == "#" and at_word_start:
            self.comment = True
        elif c == "<" and text[i + 1 : i + 2] == "<" and text[i + 2 : i + 3] != "<":
            return self._heredoc_operator(text, i + 2)
        return i + 1

    def _heredoc_operator(self, text: str, j: int) -> int:
        strip_tabs = text[j : j + 1] == "-"
        j += strip_tabs
        while j < len(text) and text[j] in " \t":
            j += 1
        start = j
        while j < len(text) and text[j] not in _WORD_BREAK:
            j += 1
        word = text[start:j]
        self.delimiter_open = j == len(text)  # the delimiter would go on in the placeholder that follows
        quoted = any(q in word for q in "'\"\\")
        delimiter = word.replace("'", "").replace('"', "").replace("\\", "")
        if word:
            self.pending.append((delimiter, quoted, strip_tabs))
        return j
