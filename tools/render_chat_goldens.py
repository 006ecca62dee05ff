#!/usr/bin/env python3
"""Golden chat-template renderings, produced by Python Jinja2 exactly as Hugging Face's
apply_chat_template configures it (transformers' render_jinja_template):

  ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]),
  tojson = json.dumps(x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys),
  raise_exception raises TemplateError, strftime_now formats the current time (pinned here),
  and render(messages=..., tools only when given, documents=None, add_generation_prompt=..., bos/eos).

`tools` is left undefined when a conversation has none, as llama.cpp's server does: transformers passes
tools=None, on which templates that loop over tools unguarded (Hermes-3's tool_use) fail.

Writes tests/data/chat_templates/goldens.json, which tests/chat/chat_template_test.cpp compares
Promptly's interpreter against byte for byte. Rerun (needs python3-jinja2 3.1) when templates or
conversations change:
    python3 tools/render_chat_goldens.py ../shared/models tests/data/chat_templates/goldens.json
"""
import json
import struct
import sys
from datetime import datetime, timezone
from pathlib import Path

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

BOS, EOS = "<s>", "</s>"
# 2025-01-15 12:00:00 UTC: noon, so the date is the same in every time zone within +-11 h.
NOW_UTC = 1736942400

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. \"Paris\""},
                "days": {"type": "integer", "description": "Forecast length"},
            },
            "required": ["city"],
        },
    },
}]

def tool_round_trip(arguments, call_content):
    """user -> assistant tool call -> tool result -> assistant answer -> user."""
    return [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": call_content, "tool_calls": [
            {"id": "abc123XYZ", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "abc123XYZ", "content": '{"temperature_c": 18, "sky": "clear"}'},
        {"role": "assistant", "content": "It is 18 \u00b0C and clear in Paris."},
        {"role": "user", "content": "And tomorrow?"},
    ]


CONVERSATIONS = {
    "single_user": {"messages": [{"role": "user", "content": "Hello!"}]},
    "system_multiturn": {"messages": [
        {"role": "system", "content": "You are a concise assistant.\nAnswer in one line."},
        {"role": "user", "content": "What's the capital of France? Say \"Paris\" or 'Paris'."},
        {"role": "assistant", "content": "Paris \u2014 la capitale. \u00c7a va \u2713"},
        {"role": "user", "content": "Et en japonais ?\n\u6771\u4eac\u3068\u6bd4\u3079\u3066\u304f\u3060\u3055\u3044\u3002"},
    ]},
    "no_system": {"messages": [
        {"role": "user", "content": "  Leading and trailing spaces  \n"},
        {"role": "assistant", "content": "\nNoted.\n"},
        {"role": "user", "content": "Line one\nLine two\n\nLine four"},
    ]},
    "thinking": {"messages": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nAdd them.\n</think>\n\n4"},
        {"role": "user", "content": "Times 3?"},
    ]},
    "tools": {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": TOOLS},
    # A tool round trip as Hugging Face documents it: arguments as an object. The call id has nine
    # alphanumerics because Mistral Nemo's template refuses any other.
    "tool_round_trip": {"messages": tool_round_trip({"city": "Paris", "days": 2}, None), "tools": TOOLS},
    # The same as an OpenAI client sends it: arguments as a JSON string.
    "tool_round_trip_string_arguments": {"messages": tool_round_trip('{"city": "Paris", "days": 2}', None), "tools": TOOLS},
    # Content "" instead of null beside the calls (what templates that cannot take null get).
    "tool_round_trip_empty_content": {"messages": tool_round_trip({"city": "Paris", "days": 2}, ""), "tools": TOOLS},
}


def gguf_chat_template(path):
    """tokenizer.chat_template from a GGUF file (a minimal metadata reader)."""
    data = Path(path).read_bytes()
    pos = 24
    n_kv = struct.unpack_from("<Q", data, 16)[0]

    def read_str():
        nonlocal pos
        n = struct.unpack_from("<Q", data, pos)[0]
        pos += 8
        s = data[pos:pos + n].decode()
        pos += n
        return s

    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def skip(t):
        nonlocal pos
        if t == 8:
            read_str()
        elif t == 9:
            et, n = struct.unpack_from("<IQ", data, pos)
            pos += 12
            for _ in range(n):
                skip(et)
        else:
            pos += sizes[t]

    for _ in range(n_kv):
        key = read_str()
        t = struct.unpack_from("<I", data, pos)[0]
        pos += 4
        if key == "tokenizer.chat_template":
            return read_str()
        skip(t)
    return None


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.fromtimestamp(NOW_UTC, tz=timezone.utc).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    models = Path(sys.argv[1] if len(sys.argv) > 1 else "../shared/models")
    out = Path(sys.argv[2] if len(sys.argv) > 2 else "tests/data/chat_templates/goldens.json")
    templates = {p.name: p.read_text() for p in sorted((models / "templates").glob("*.jinja"))}
    templates["ggml-vocab-phi-3.gguf"] = gguf_chat_template(models / "vocab" / "ggml-vocab-phi-3.gguf")
    env = make_env()
    cases = []
    for name, source in templates.items():
        template = env.from_string(source)
        for conv_name, conv in CONVERSATIONS.items():
            for gp in (False, True):
                case = {"template": name, "conversation": conv_name, "add_generation_prompt": gp}
                try:
                    case["output"] = template.render(messages=conv["messages"], documents=None, add_generation_prompt=gp,
                                                     bos_token=BOS, eos_token=EOS,
                                                     **({"tools": conv["tools"]} if "tools" in conv else {}))
                except Exception as e:  # the template's own raise_exception, or a Python error
                    case["error"] = f"{type(e).__name__}: {e}"
                cases.append(case)
    doc = {
        "generator": "tools/render_chat_goldens.py with Python Jinja2 " + jinja2.__version__,
        "bos_token": BOS, "eos_token": EOS, "now_utc": NOW_UTC,
        "conversations": CONVERSATIONS, "cases": cases,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n")
    print(f"{len(cases)} cases, {sum('error' in c for c in cases)} errors -> {out}")


if __name__ == "__main__":
    main()
