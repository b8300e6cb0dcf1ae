"""What llama-server answers, read as a client reads it: the generated text of a response or of one
chunk of a stream (its native ``content``, an OpenAI completion's ``choices[].text``, a chat's
``choices[].delta.content`` or ``message.content``), the server's ``timings`` (in the response, or a
stream's last chunk), the output tokens it counted, and an error it reports."""

from __future__ import annotations

from typing import Any

# the text a response keeps, at most (characters), in the responses file
TEXT_MAX = 1 << 20


def _choice_text(choice: Any) -> str:
    if type(choice) is not dict:
        return ""
    parts = [choice.get("text")]
    for key in ("delta", "message"):
        inner = choice.get(key)
        if type(inner) is dict:
            parts += [inner.get("reasoning_content"), inner.get("content")]
    return "".join(p for p in parts if type(p) is str)


def generated_text(obj: Any) -> str:
    """The generated text a response or a stream's chunk holds ("" for none)."""
    if type(obj) is not dict:
        return ""
    content = obj.get("content")
    if type(content) is str:
        return content
    choices = obj.get("choices")
    if type(choices) is list:
        return "".join(_choice_text(c) for c in choices)
    return ""


def timings(obj: Any) -> dict[str, Any] | None:
    """The server's ``timings`` object, its numbers only."""
    t = obj.get("timings") if type(obj) is dict else None
    if type(t) is not dict:
        return None
    return {k: v for k, v in t.items() if type(v) in (int, float)}


def output_tokens(obj: Any, t: dict[str, Any] | None) -> int | None:
    """The output tokens the server counted: its timings' ``predicted_n``, else an OpenAI
    ``usage.completion_tokens``, else a native ``tokens_predicted``."""
    if t is not None and type(t.get("predicted_n")) is int:
        return int(t["predicted_n"])
    if type(obj) is not dict:
        return None
    usage = obj.get("usage")
    if type(usage) is dict and type(usage.get("completion_tokens")) is int:
        return int(usage["completion_tokens"])
    n = obj.get("tokens_predicted")
    return n if type(n) is int else None


def error_of(obj: Any) -> str | None:
    """The error a response or a chunk reports (its message), or None."""
    e = obj.get("error") if type(obj) is dict else None
    if e is None:
        return None
    if type(e) is dict:
        e = e.get("message", e)
    return str(e)[:200]


def sse_data(line: str) -> str | None:
    """The data of a server-sent event's ``data:`` line, or None for any other line."""
    if not line.startswith("data:"):
        return None
    return line[5:].strip()
