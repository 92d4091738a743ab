package template_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/tokenizer/template"
)

func mustParse(tb testing.TB, src string) *template.Template {
	tb.Helper()
	tmpl, err := template.Parse(src, map[string]string{"bos_token": "<s>"}, template.Options{Now: pinnedClock})
	if err != nil {
		tb.Fatalf("Parse: %v", err)
	}
	return tmpl
}

func mustRender(tb testing.TB, tmpl *template.Template, req template.Request) template.Result {
	tb.Helper()
	res, err := tmpl.Render(req)
	if err != nil {
		tb.Fatalf("Render: %v", err)
	}
	return res
}

func writeDir(tb testing.TB, files map[string]string) string {
	tb.Helper()
	dir := tb.TempDir()
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	return dir
}

var userHi = json.RawMessage(`[{"role":"user","content":"hi"}]`)

func TestLoad(t *testing.T) {
	named := `{"chat_template":[{"name":"default","template":"D{{ tools is none }}"},{"name":"tool_use","template":"T{{ tools | length }}"}]}`
	t.Run("named templates pick tool_use only with tools", func(t *testing.T) {
		tmpl, err := template.Load(writeDir(t, map[string]string{"tokenizer_config.json": named}), template.Options{})
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			tools json.RawMessage
			want  string
		}{
			{nil, "DTrue"},
			{json.RawMessage(`null`), "DTrue"},
			{json.RawMessage(`[]`), "T0"},
			{json.RawMessage(`[{"type":"function","function":{"name":"f"}}]`), "T1"},
		} {
			got := mustRender(t, tmpl, template.Request{Messages: userHi, Tools: tc.tools}).Prompt
			if got != tc.want {
				t.Errorf("tools %s: got %q, want %q", tc.tools, got, tc.want)
			}
		}
	})
	t.Run("chat_template.jinja wins over the config", func(t *testing.T) {
		dir := writeDir(t, map[string]string{
			"tokenizer_config.json": `{"chat_template":"config","bos_token":"<b>"}`,
			"chat_template.jinja":   "file {{ bos_token }}",
		})
		tmpl, err := template.Load(dir, template.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := mustRender(t, tmpl, template.Request{Messages: userHi}).Prompt, "file <b>"; got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	})
	t.Run("Options.ChatTemplate wins over both", func(t *testing.T) {
		dir := writeDir(t, map[string]string{
			"tokenizer_config.json": `{"chat_template":"config"}`,
			"chat_template.jinja":   "file",
		})
		tmpl, err := template.Load(dir, template.Options{ChatTemplate: "override"})
		if err != nil {
			t.Fatal(err)
		}
		if got := mustRender(t, tmpl, template.Request{Messages: userHi}).Prompt; got != "override" {
			t.Errorf("got %q, want %q", got, "override")
		}
	})
	t.Run("special tokens as transformers maps them", func(t *testing.T) {
		cfg := `{"chat_template":"{{ bos_token }}|{{ eos_token }}|{{ unk_token is defined }}|{{ pad_token is defined }}|{{ additional_special_tokens | join(',') }}|{{ image_token }}",
			"bos_token":{"__type":"AddedToken","content":"<B>","lstrip":false},"eos_token":"<E>","unk_token":null,"pad_token":"",
			"additional_special_tokens":["<x>","<y>"],"extra_special_tokens":{"image_token":"<img>"}}`
		tmpl, err := template.Load(writeDir(t, map[string]string{"tokenizer_config.json": cfg}), template.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := mustRender(t, tmpl, template.Request{Messages: userHi}).Prompt, "<B>|<E>|False|False|<x>,<y>|<img>"; got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	})
	t.Run("errors", func(t *testing.T) {
		for name, files := range map[string]map[string]string{
			"no config":      {},
			"no template":    {"tokenizer_config.json": `{"bos_token":"<s>"}`},
			"no default":     {"tokenizer_config.json": `{"chat_template":[{"name":"rag","template":"x"}]}`},
			"bad jinja":      {"tokenizer_config.json": `{"chat_template":"{% for %}"}`},
			"malformed json": {"tokenizer_config.json": `{`},
		} {
			if _, err := template.Load(writeDir(t, files), template.Options{}); err == nil {
				t.Errorf("%s: got nil error, want one", name)
			}
		}
	})
}

// TestContentFormat checks vLLM's detection rule through its effect: with
// the "openai" format a message's content reaches the template as a list.
func TestContentFormat(t *testing.T) {
	const mark = "{{ 'L' if messages[0].content is not string else 'S' }}"
	for _, tc := range []struct {
		name, src string
		openai    bool
	}{
		{"no content loop", "{% for m in messages %}{{ m.content }}{% endfor %}", false},
		{"attribute loop", "{% for m in messages %}{% for c in m.content %}{% endfor %}{% endfor %}", true},
		{"item loop", "{% for m in messages %}{% for c in m['content'] %}{% endfor %}{% endfor %}", true},
		{"filtered loop", "{% for m in messages %}{% for c in m.content | selectattr('type', 'equalto', 'text') %}{% endfor %}{% endfor %}", true},
		{"loop with condition", "{% for m in messages %}{%- for c in m.content if c.type == 'text' -%}{% endfor %}{% endfor %}", true},
		{"assigned messages", "{% set loop_messages = messages[1:] %}{% for m in loop_messages %}{% for c in m.content %}{% endfor %}{% endfor %}", true},
		{"assigned twice", "{% set a = messages %}{% set b = a | reverse %}{% for m in b %}{% for c in m.content %}{% endfor %}{% endfor %}", true},
		{"sliced messages", "{% for m in messages[::-1] %}{% for c in m.content %}{% endfor %}{% endfor %}", true},
		{"content of an index", "{% for c in messages[0].content %}{% endfor %}", false},
		{"expression over messages", "{% for m in messages + [] %}{% for c in m.content %}{% endfor %}{% endfor %}", false},
		{"tuple target", "{% for m in messages %}{% for a, b in m.content %}{% endfor %}{% endfor %}", false},
		{"in a comment", "{# {% for m in messages %}{% for c in m.content %}{% endfor %}{% endfor %} #}", false},
		{"in a raw block", "{% raw %}{% for m in messages %}{% for c in m.content %}{% endraw %}", false},
		{"in a string", "{{ '{% for m in messages %}{% for c in m.content %}' }}", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmpl := mustParse(t, mark+tc.src)
			got := mustRender(t, tmpl, template.Request{Messages: userHi}).Prompt
			want := "S"
			if tc.openai {
				want = "L"
			}
			if got[:1] != want {
				t.Errorf("got format %q, want %q (openai=%v)", got[:1], want, tc.openai)
			}
		})
	}
}

func TestNormalization(t *testing.T) {
	t.Run("messages rebuilt with vLLM's keys", func(t *testing.T) {
		tmpl := mustParse(t, "{{ messages | tojson }}")
		msgs := `[{"role":"user","content":null,"extra":1,"name":"ann"},
			{"role":"assistant","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}],"reasoning":"r",
			 "tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"[1, 2.0]"}},
			               {"id":"2","type":"function","function":{"name":"g","arguments":"{bad"}}]},
			{"role":"tool","tool_call_id":"1","content":[{"type":"text","text":"x"},{"type":"text","text":"y"}]},
			{"role":"developer","content":"d"}]`
		got := mustRender(t, tmpl, template.Request{Messages: json.RawMessage(msgs), AddGenerationPrompt: new(bool)}).Prompt
		want := `[{"role": "user", "content": "", "name": "ann"}, ` +
			`{"role": "assistant", "content": "a\nb", "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": [1, 2.0]}}, ` +
			`{"id": "2", "type": "function", "function": {"name": "g", "arguments": {}}}], "reasoning": "r", "reasoning_content": "r"}, ` +
			`{"role": "tool", "content": "x\ny", "tool_call_id": "1"}, {"role": "developer", "content": "d", "tools": null}]`
		if got != want {
			t.Errorf("got  %s\nwant %s", got, want)
		}
	})
	t.Run("tools dumped as vLLM's pydantic model", func(t *testing.T) {
		tmpl := mustParse(t, "{{ tools | tojson }}")
		tools := `[{"function":{"name":"f","extra":1},"type":"function","x":2},{"type":"function","defer_loading":true,"function":{"strict":false,"parameters":{"b":1,"a":2},"name":"g"}}]`
		got := mustRender(t, tmpl, template.Request{Messages: userHi, Tools: json.RawMessage(tools)}).Prompt
		want := `[{"type": "function", "function": {"name": "f", "description": null, "parameters": null}}, ` +
			`{"type": "function", "function": {"name": "g", "description": null, "parameters": {"b": 1, "a": 2}, "strict": false, "defer_loading": true}, "defer_loading": true}]`
		if got != want {
			t.Errorf("got  %s\nwant %s", got, want)
		}
	})
	t.Run("request fields become variables", func(t *testing.T) {
		tmpl := mustParse(t, "{{ add_generation_prompt }}|{{ documents | tojson }}|{{ reasoning_effort }}|{{ enable_thinking }}|{{ continue_final_message is defined }}")
		got := mustRender(t, tmpl, template.Request{
			Messages:        userHi,
			Documents:       json.RawMessage(`[{"title":"t","text":"x"}]`),
			ReasoningEffort: "low",
			Kwargs:          json.RawMessage(`{"enable_thinking":false,"add_generation_prompt":false}`),
		}).Prompt
		if want := `True|[{"title": "t", "text": "x"}]|low|False|False`; got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	})
}

func TestErrors(t *testing.T) {
	yes := true
	for _, tc := range []struct {
		name, src string
		req       template.Request
		wantMsg   string // "" for an engine error rather than a RequestError
	}{
		{"raise_exception message", "{{ raise_exception('Roles must alternate: ' ~ messages[0].role) }}",
			template.Request{Messages: userHi}, "Roles must alternate: user"},
		{"both generation flags", "x", template.Request{Messages: userHi, AddGenerationPrompt: &yes, ContinueFinalMessage: true},
			"Cannot set both `continue_final_message` and `add_generation_prompt` to True."},
		{"tokenize kwarg", "x", template.Request{Messages: userHi, Kwargs: json.RawMessage(`{"tokenize":true}`)},
			"Found unexpected chat template kwargs from request: {'tokenize'}"},
		{"messages not a list", "x", template.Request{Messages: json.RawMessage(`{"role":"user"}`)}, "messages: not a list"},
		{"unknown part type", "x", template.Request{Messages: json.RawMessage(`[{"role":"user","content":[{"type":"hologram"}]}]`)},
			"messages[0]: Unsupported chat content part type: 'hologram'."},
		{"integer beyond int64", "{{ messages }}", template.Request{Messages: json.RawMessage(`[{"role":"assistant","content":"","tool_calls":[{"function":{"name":"f","arguments":"{\"n\": 99999999999999999999}"}}]}]`)},
			"messages: integer 99999999999999999999 does not fit in 64 bits"},
		{"engine error", "{{ nosuchfunction() }}", template.Request{Messages: userHi}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := mustParse(t, tc.src).Render(tc.req)
			if err == nil {
				t.Fatal("got nil error")
			}
			if !strings.HasPrefix(err.Error(), "template: ") {
				t.Errorf("error %q lacks the package prefix", err)
			}
			var re *template.RequestError
			isReq := errors.As(err, &re)
			if tc.wantMsg == "" {
				if isReq {
					t.Errorf("got RequestError %q, want an engine error", re.Msg)
				}
				return
			}
			if !isReq || re.Msg != tc.wantMsg {
				t.Errorf("got %v, want RequestError %q", err, tc.wantMsg)
			}
		})
	}
}

func TestClock(t *testing.T) {
	src := "{{ strftime_now('%Y') }}"
	t.Run("injected", func(t *testing.T) {
		if got := mustRender(t, mustParse(t, src), template.Request{Messages: userHi}).Prompt; got != "2025" {
			t.Errorf("got %q, want 2025", got)
		}
	})
	t.Run("default is time.Now", func(t *testing.T) {
		tmpl, err := template.Parse(src, nil, template.Options{})
		if err != nil {
			t.Fatal(err)
		}
		before := time.Now().Year()
		got := mustRender(t, tmpl, template.Request{Messages: userHi}).Prompt
		after := time.Now().Year()
		if got != strconv.Itoa(before) && got != strconv.Itoa(after) {
			t.Errorf("got %q, want the current year %d", got, before)
		}
	})
}

func TestConcurrentRender(t *testing.T) {
	tmpl := mustParse(t, "{% for m in messages %}{{ m.role }}:{{ m.content }}|{% endfor %}{{ strftime_now('%d') }}")
	want := mustRender(t, tmpl, template.Request{Messages: userHi}).Prompt
	var wg sync.WaitGroup
	errs := make(chan string, 64)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				res, err := tmpl.Render(template.Request{Messages: userHi})
				if err != nil || res.Prompt != want {
					errs <- res.Prompt
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for got := range errs {
		t.Errorf("concurrent render: got %q, want %q", got, want)
	}
}
