"""The chat requests render.py turns into goldens.

Bodies are OpenAI chat-completion request bodies (only the fields that reach
the chat template). Most are Python values serialised compactly; the few
that pin JSON number spellings are raw JSON text, so that 47.0 and 1e-05
reach both renderers exactly as a client wrote them.
"""

import json

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "days": {"type": "integer", "minimum": 1, "maximum": 14},
                "threshold": {"type": "number", "default": 0.5},
                "units": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}

BOOK = {
    "type": "function",
    "function": {
        "name": "book_table",
        "description": "Book a restaurant table <fast> & \"easy\"",
        "parameters": {
            "type": "object",
            "properties": {
                "party": {
                    "type": "object",
                    "properties": {
                        "adults": {"type": "integer"},
                        "names": {"type": "array", "items": {"type": "string"}},
                    },
                },
                "time": {"type": "string"},
                "vip": {"type": "boolean"},
            },
        },
    },
}

BARE = {"type": "function", "function": {"name": "ping"}}

SYS = {"role": "system", "content": "You are a helpful assistant."}
U1 = {"role": "user", "content": "What's the weather in Paris?"}


def call(cid, name, args):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def tool_msg(cid, content):
    return {"role": "tool", "tool_call_id": cid, "content": content}


def body(messages, **kw):
    b = {"messages": messages}
    b.update(kw)
    return json.dumps(b, ensure_ascii=False, separators=(",", ":"))


def common():
    """Cases every template renders (or rejects, as the golden records)."""
    c = []

    def add(name, raw):
        c.append({"name": name, "body": raw})

    add("single_user", body([U1]))
    add("system_user", body([SYS, U1]))
    add("multi_turn", body([
        SYS, U1,
        {"role": "assistant", "content": "It is sunny and 21°C in Paris."},
        {"role": "user", "content": "And tomorrow?"},
    ]))
    add("multi_turn_no_system", body([
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke."},
        {"role": "assistant", "content": "Why did the chicken cross the road?"},
        {"role": "user", "content": "Why?"},
    ]))
    add("no_generation_prompt", body([SYS, U1, {"role": "assistant", "content": "Sunny."}],
                                     add_generation_prompt=False))
    add("generation_prompt_explicit_true", body([U1], add_generation_prompt=True))
    add("continue_final_message", body([
        U1, {"role": "assistant", "content": "The weather in Paris is"}],
        add_generation_prompt=False, continue_final_message=True))
    add("continue_final_message_trailing_space", body([
        U1, {"role": "assistant", "content": "Let me think. "}],
        add_generation_prompt=False, continue_final_message=True))
    add("continue_final_message_with_generation_prompt_default", body([
        U1, {"role": "assistant", "content": "Partial"}], continue_final_message=True))
    add("continue_final_message_and_generation_prompt", body([
        U1, {"role": "assistant", "content": "Partial"}],
        continue_final_message=True, add_generation_prompt=True))
    add("unicode_emoji", body([
        {"role": "system", "content": "Réponds en français 🇫🇷, s'il te plaît."},
        {"role": "user", "content": "日本語で答えて 😀👍🏽 — «quotes» ‘single’ \\backslash\\ tab\there"},
    ]))
    add("content_parts_user", body([
        SYS,
        {"role": "user", "content": [
            {"type": "text", "text": "First part."},
            {"type": "text", "text": "Second part."},
        ]},
    ]))
    add("content_parts_system", body([
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": "Hello"},
    ]))
    add("content_null_user", body([{"role": "user", "content": None}]))
    add("whitespace_content", body([
        {"role": "system", "content": "  padded system  \n"},
        {"role": "user", "content": "\n\n  padded user \t\n"},
    ]))
    add("tools_user", body([U1], tools=[WEATHER]))
    add("tools_system_user", body([SYS, U1], tools=[WEATHER, BOOK, BARE]))
    add("tools_empty_list", body([SYS, U1], tools=[]))
    add("tool_call_roundtrip", body([
        SYS, U1,
        {"role": "assistant", "content": None, "tool_calls": [
            call("call_1", "get_weather", '{"city": "Paris", "days": 3, "threshold": 0.75}')]},
        tool_msg("call_1", '{"temperature": 21.5, "condition": "sunny"}'),
    ], tools=[WEATHER]))
    add("tool_call_nested_args", body([
        {"role": "user", "content": "Book for Ann and Bo at 7pm"},
        {"role": "assistant", "content": "", "tool_calls": [
            call("call_b", "book_table",
                 '{"party": {"adults": 2, "names": ["Ann", "Bo"]}, "time": "19:00", "vip": false, "note": null}')]},
        tool_msg("call_b", "Booked: table 12"),
        {"role": "assistant", "content": "Your table is booked."},
        {"role": "user", "content": "Thanks!"},
    ], tools=[WEATHER, BOOK]))
    add("tool_call_invalid_json_args", body([
        U1,
        {"role": "assistant", "content": None, "tool_calls": [call("c", "get_weather", "{not json")]},
        tool_msg("c", "error"),
    ], tools=[WEATHER]))
    add("tool_call_object_args", body([
        U1,
        {"role": "assistant", "content": None, "tool_calls": [call("c", "get_weather", {"city": "Oslo", "days": 2})]},
        tool_msg("c", "cold"),
    ], tools=[WEATHER]))
    add("tool_result_parts", body([
        U1,
        {"role": "assistant", "content": None, "tool_calls": [call("c", "get_weather", '{"city":"Rome"}')]},
        {"role": "tool", "tool_call_id": "c", "content": [
            {"type": "text", "text": "line one"}, {"type": "text", "text": "line two"}]},
    ], tools=[WEATHER]))
    add("parallel_tool_calls", body([
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": None, "tool_calls": [
            call("a", "get_weather", '{"city": "Paris"}'),
            call("b", "get_weather", '{"city": "Rome", "units": "celsius"}')]},
        tool_msg("a", "sunny"),
        tool_msg("b", "rainy"),
    ], tools=[WEATHER]))
    add("empty_tool_calls_dropped", body([
        U1, {"role": "assistant", "content": "No tools needed.", "tool_calls": []},
        {"role": "user", "content": "ok"},
    ]))
    add("thinking_off", body([U1], chat_template_kwargs={"enable_thinking": False}))
    add("thinking_on", body([U1], chat_template_kwargs={"enable_thinking": True}))
    add("thinking_off_multi_turn", body([
        U1, {"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "Sure?"}],
        chat_template_kwargs={"enable_thinking": False}))
    add("assistant_reasoning_field", body([
        U1, {"role": "assistant", "content": "Sunny.", "reasoning": "Check the forecast."},
        {"role": "user", "content": "Thanks"},
        {"role": "assistant", "content": "You're welcome.", "reasoning": "Be polite."},
    ], add_generation_prompt=False))
    add("assistant_inline_think", body([
        U1, {"role": "assistant", "content": "<think>\nLook it up.\n</think>\n\nSunny."},
    ], add_generation_prompt=False))
    add("bad_role_order", body([
        {"role": "user", "content": "one"}, {"role": "user", "content": "two"}]))
    add("assistant_first", body([
        {"role": "assistant", "content": "I speak first."}, {"role": "user", "content": "ok"}]))
    add("unknown_kwarg_ignored", body([U1], chat_template_kwargs={"not_in_template": 1}))
    add("user_name_field", body([{"role": "user", "content": "hi", "name": "alice"}]))
    add("json_special_chars_tool", body([{"role": "user", "content": "go"}], tools=[{
        "type": "function", "function": {
            "name": "echo", "description": "Quotes \" backslash \\ newline \n tab \t ctrl \u0001 unicode ü 🚀",
            "parameters": {"type": "object", "properties": {}}}}]))
    # Raw bodies pin number spellings: ints, floats with .0, exponents.
    c.append({"name": "number_spellings", "body": (
        '{"messages":[{"role":"user","content":"n"},{"role":"assistant","content":null,'
        '"tool_calls":[{"id":"x","type":"function","function":{"name":"get_weather",'
        '"arguments":"{\\"days\\": 47, \\"threshold\\": 47.0, \\"tiny\\": 1e-05, \\"big\\": 1E+16, '
        '\\"neg\\": -0.5, \\"exp\\": 2.5e3, \\"i64\\": 9007199254740993, \\"t\\": true, \\"n\\": null}"}}]},'
        '{"role":"tool","tool_call_id":"x","content":"ok"}],'
        '"tools":[{"type":"function","function":{"name":"get_weather","parameters":'
        '{"type":"object","properties":{"threshold":{"type":"number","default":47.0,"minimum":0.0,'
        '"maximum":1e2},"days":{"type":"integer","default":3}}}}}]}'
    )})
    c.append({"name": "key_order_preserved", "body": (
        '{"messages":[{"role":"user","content":"z"},{"role":"assistant","content":null,'
        '"tool_calls":[{"id":"k","type":"function","function":{"name":"f",'
        '"arguments":"{\\"zeta\\": 1, \\"alpha\\": {\\"y\\": 2, \\"b\\": 3}, \\"mid\\": [3, 2, 1]}"}}]}],'
        '"tools":[{"function":{"parameters":{"zz":1,"aa":2},"description":"d","name":"f"},"type":"function"}],'
        '"add_generation_prompt":false}'
    )})
    return c


def multimodal():
    """Only for templates that take openai-format content (parts stay dicts)."""
    c = []
    c.append({"name": "image_part", "body": body([
        {"role": "user", "content": [
            {"type": "text", "text": "Describe this:"},
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
            {"type": "text", "text": "in one line."}]}])})
    c.append({"name": "image_second_turn", "body": body([
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            {"type": "text", "text": "What is it?"}]}])})
    return c


def qwen_only():
    c = []
    c.append({"name": "qwen_multi_step_tool_response_user", "body": body([
        {"role": "user", "content": "Plan a trip"},
        {"role": "assistant", "content": "<think>\nneed weather\n</think>\n\nChecking.",
         "tool_calls": [call("t1", "get_weather", '{"city": "Lisbon"}')]},
        tool_msg("t1", "warm"),
        {"role": "user", "content": "<tool_response>\nmanual\n</tool_response>"},
    ], tools=[WEATHER])})
    c.append({"name": "qwen_thinking_off_tools", "body": body([SYS, U1], tools=[WEATHER],
                                                           chat_template_kwargs={"enable_thinking": False})})
    return c


def llama_json_only():
    c = []
    c.append({"name": "llama_json_date_string_kwarg", "body": body([U1], tools=[WEATHER],
                                                                   chat_template_kwargs={"date_string": "01 Jan 2030"})})
    c.append({"name": "llama_json_tools_in_system", "body": body([SYS, U1], tools=[WEATHER],
                                                                 chat_template_kwargs={"tools_in_user_message": False})})
    c.append({"name": "llama_json_tools_no_messages_left", "body": body([SYS], tools=[WEATHER])})
    return c


def cases_for(name):
    c = common()
    if name in ("gemma3", "llama3_1_json"):
        c += multimodal()
    if name == "qwen3":
        c += qwen_only()
    if name == "llama3_1_json":
        c += llama_json_only()
    return c
