// Package template renders a model's chat template exactly as vLLM does,
// so that the router hashes the same prompt bytes the engine caches.
//
// vLLM renders a chat request in two steps, and both are reproduced here:
// it normalises the OpenAI messages (content parts joined into a string
// or kept as a list depending on the template, null content, tool-call
// arguments parsed from JSON strings, tools dumped through its pydantic
// model), then calls transformers' apply_chat_template, which runs the
// Jinja template in a sandbox with trim_blocks, lstrip_blocks, loop
// controls, a json.dumps-like tojson, raise_exception and strftime_now,
// and the special tokens of tokenizer_config.json as variables.
//
// The Jinja engine is github.com/ardanlabs/jinja; parity with Python's
// jinja2 is checked against committed goldens rendered by
// testdata/gen/render.py (see testdata/README.md).
package template
