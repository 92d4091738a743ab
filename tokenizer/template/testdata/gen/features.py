"""Small synthetic templates, one Jinja feature each, for golden/features.jsonl.

The model templates exercise what today's models use; these pin the engine
features other templates lean on (loop controls, tojson's options, Python's
printing of values, tests, filters, string methods, macros), each rendered
by Python's jinja2 in transformers' environment.
"""

import json

SPECIALS = {"bos_token": "<s>", "eos_token": "</s>"}

MSGS = [
    {"role": "system", "content": "sys"},
    {"role": "user", "content": "Hello, World"},
    {"role": "assistant", "content": "  hi there  "},
    {"role": "user", "content": "bye"},
]


def body(messages=None, **kw):
    b = {"messages": messages or MSGS}
    b.update(kw)
    return json.dumps(b, ensure_ascii=False, separators=(",", ":"))


DATA = {"b": 2, "a": [1, 2.5, "x", True, None], "u": "é<&>'\"", "n": {"z": 0.1, "k": -3}}

FEATURES = [
    ("loop_break", "{% for m in messages %}{% if m.role == 'assistant' %}{% break %}{% endif %}{{ m.role }};{% endfor %}", body()),
    ("loop_continue", "{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}{{ loop.index }}{{ m.role }} {% endfor %}", body()),
    ("loop_vars", "{% for m in messages %}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}|{% endfor %}", body()),
    ("loop_else_filter", "{% for m in messages if m.role == 'tool' %}x{% else %}none{% endfor %}", body()),
    ("trim_lstrip_blocks", "A\n  {% if true %}\n    B\n  {% endif %}\nC\n{# c #}\nD", body()),
    ("tojson_default", "{{ d | tojson }}", body(chat_template_kwargs={"d": DATA})),
    ("tojson_indent", "{{ d | tojson(indent=2) }}", body(chat_template_kwargs={"d": DATA})),
    ("tojson_separators", "{{ d | tojson(separators=(',', ':')) }}", body(chat_template_kwargs={"d": DATA})),
    ("tojson_sort_keys", "{{ d | tojson(sort_keys=true) }}", body(chat_template_kwargs={"d": DATA})),
    ("tojson_ensure_ascii", "{{ d | tojson(ensure_ascii=true) }}", body(chat_template_kwargs={"d": DATA})),
    ("tojson_empty_containers", "{{ e | tojson(indent=4) }}|{{ e | tojson }}", body(chat_template_kwargs={"e": {"l": [], "o": {}}})),
    ("print_python_values", "{{ t }} {{ f }} {{ n }} {{ i }} {{ x }} {{ l }} {{ o }}",
     body(chat_template_kwargs={"t": True, "f": False, "n": None, "i": 3, "x": 2.0, "l": [1, "a", None], "o": {"k": "v", "b": True}})),
    ("print_floats", "{{ a }} {{ b }} {{ c }} {{ 1 / 3 }} {{ 10 / 2 }} {{ 7 // 2 }} {{ 2 ** 10 }} {{ 0.1 + 0.2 }}",
     '{"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"a":1e-07,"b":123456789012345680000.0,"c":-0.0}}'),
    ("string_methods", "{% for m in messages %}{{ m.content.strip() }}|{{ m.content.split(',')[0] }}|{{ m.content.upper() }}|{{ m.content.startswith('He') }}|{{ m.content.replace('l', 'L') }};{% endfor %}", body()),
    ("string_filters", "{{ messages[1].content | lower }}|{{ messages[1].content | title }}|{{ messages[2].content | trim | length }}|{{ messages | map(attribute='role') | join(',') }}|{{ messages | selectattr('role', 'equalto', 'user') | list | length }}", body()),
    ("tests_and_in", "{{ x is defined }}{{ y is defined }}{{ x is string }}{{ n is none }}{{ 'ell' in messages[1].content }}{{ 'role' in messages[0] }}{{ 3 is odd }}",
     body(chat_template_kwargs={"x": "s", "n": None})),
    ("undefined_attr_renders_empty", "[{{ messages[0].missing }}][{{ nothing }}][{{ messages[0].get('missing', 'dflt') }}]", body()),
    ("namespace_and_set", "{% set ns = namespace(count=0, names='') %}{% for m in messages %}{% set ns.count = ns.count + 1 %}{% set ns.names = ns.names ~ m.role[0] %}{% endfor %}{{ ns.count }}-{{ ns.names }}", body()),
    ("macro", "{% macro show(m, sep='/') %}{{ m.role }}{{ sep }}{{ m.content | trim }}{% endmacro %}{% for m in messages %}{{ show(m) }} {{ show(m, sep=':') }} {% endfor %}", body()),
    ("slices_and_reverse", "{{ (messages[1:] | map(attribute='role') | list) }}{{ messages[::-1][0].role }}{{ messages[-1].content }}{% for m in messages | reverse %}{{ m.role[:1] }}{% endfor %}", body()),
    ("dict_items", "{% for k, v in o.items() %}{{ k }}={{ v }};{% endfor %}{{ o | length }}", body(chat_template_kwargs={"o": {"z": 1, "a": [1], "m": {"x": None}}})),
    ("raise_message", "{% if messages | length > 2 %}{{ raise_exception('Too many messages: ' ~ messages | length) }}{% endif %}", body()),
    ("strftime_formats", "{{ strftime_now('%Y-%m-%d %H:%M:%S') }}|{{ strftime_now('%d %B %Y') }}|{{ strftime_now('%A %a %b %I%p %j %y') }}|{{ strftime_now('%-d %-m') }}", body()),
    ("special_tokens", "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}{{ unk_token is defined }}", body()),
    ("generation_tag", "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}|{% endfor %}", body()),
    ("default_filter", "{{ missing | default('d') }}|{{ none_val | default('d') }}|{{ none_val | default('d', true) }}|{{ '' | default('e', true) }}",
     body(chat_template_kwargs={"none_val": None})),
    ("whitespace_control", "{%- for m in messages -%}\n  [{{- m.role -}}]\n{%- endfor %}\n  end", body()),
    ("content_parts_loop", "{% for m in messages %}{% for c in m.content %}{{ c.type }}:{{ c.text }},{% endfor %};{% endfor %}",
     body([{"role": "user", "content": "plain"}, {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])),
    ("tool_args_mapping", "{% for m in messages %}{% for tc in m.tool_calls or [] %}{{ tc.function.arguments is mapping }}{% for k, v in tc.function.arguments.items() %}{{ k }}={{ v }} {% endfor %}{{ tc.function.arguments | tojson }}{% endfor %}{% endfor %}",
     '{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{\\"x\\": 1.0, \\"y\\": [true, null], \\"z\\": \\"s\\"}"}}]}]}'),
    ("int_float_compare", "{{ 1 == 1.0 }}{{ (2.0 | int) }}{{ (3 | float) }}{{ '5' | int + 1 }}{{ [3, 1, 2] | sort | first }}{{ [1, 2, 3] | sum }}{{ 7 % 3 }}{{ -7 // 2 }}", body()),
]


def feature_cases():
    return [{"name": n, "template": t, "body": b} for n, t, b in FEATURES]
